"""Load-time fp8 conversions and the fp8 linear layer, against their definitions."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from accord.backends import get_backend
from accord.core.quantization import Fp8Linear, dequantize_blocks, quantize_blocks, quantize_per_channel
from accord.op_contracts import OpDispatcher

E4M3_MAX = 448.0
#: e4m3 rounds to 3 mantissa bits: relative error at most 2^-4 of a value's magnitude.
E4M3_RELATIVE = 2**-4


@pytest.fixture(scope="module")
def ops() -> OpDispatcher:
    return OpDispatcher(get_backend("reference"), strict=True)


def test_block_scales_are_each_tiles_amax_over_e4m3_max():
    weight = torch.randn(200, 300)
    _, scales = quantize_blocks(weight)
    assert scales.shape == (2, 3)
    assert scales[1, 2].item() == pytest.approx(weight[128:, 256:].abs().max().item() / E4M3_MAX)


def test_block_quantisation_round_trips_within_e4m3_precision():
    weight = torch.randn(200, 300)
    quantised, scales = quantize_blocks(weight)
    restored = dequantize_blocks(quantised, scales, torch.float32)
    assert quantised.dtype == torch.float8_e4m3fn
    assert ((restored - weight).abs() <= E4M3_RELATIVE * weight.abs() + 1e-3).all()


def test_stacked_expert_weights_get_one_scale_table_per_expert():
    quantised, scales = quantize_blocks(torch.randn(4, 256, 64))
    assert quantised.shape == (4, 256, 64) and scales.shape == (4, 2, 1)


@pytest.mark.parametrize("scale_mode", ["block", "row"])
def test_fp8_linear_matches_the_dense_product_of_its_dequantised_weight(ops, scale_mode):
    weight, x = torch.randn(256, 192), torch.randn(5, 192)
    if scale_mode == "block":
        quantised, scales = quantize_blocks(weight)
        dense = dequantize_blocks(quantised, scales, torch.float32)
    else:
        quantised, scales = quantize_per_channel(ops, weight)
        dense = quantised.float() * scales
    out = Fp8Linear(ops, quantised, scales, scale_mode)(x)
    expected = F.linear(x, dense)
    # Only the activations' own fp8 rounding separates the two.
    assert float((out - expected).norm() / expected.norm()) < E4M3_RELATIVE
