"""The Triton fp8 kernels: quantize_fp8 gives the reference's scales and fp8 codes bit
for bit in every mode and both fp8 flavours, and scaled_mm matches the reference for
per-tensor, per-row and 128x128 block scales."""

from __future__ import annotations

import pytest
import torch

from accord.op_contracts import FLOAT_DTYPES, FP8_DTYPES, FP8_MAX


def _randn(*shape: int, seed: int = 0) -> torch.Tensor:
    return torch.randn(*shape, generator=torch.Generator().manual_seed(seed))


def _same_bits(a: torch.Tensor, b: torch.Tensor) -> bool:
    return a.dtype == b.dtype and torch.equal(a.view(torch.uint8), b.view(torch.uint8))


@pytest.mark.parametrize("fp8_dtype", FP8_DTYPES)
@pytest.mark.parametrize("mode", ["per_tensor", "per_token", "per_group"])
@pytest.mark.parametrize("dtype", FLOAT_DTYPES)
def test_quantize_fp8_gives_the_reference_scales_and_codes(triton_ops, reference_ops, dtype, mode, fp8_dtype):
    x = (_randn(3, 200) * 30).to(dtype)
    x[1] = 0  # an all-zero granule still gets a finite scale
    q, scales = triton_ops.quantize_fp8(x, mode=mode, fp8_dtype=fp8_dtype)
    q_ref, scales_ref = reference_ops.quantize_fp8(x, mode=mode, fp8_dtype=fp8_dtype)
    assert torch.equal(scales, scales_ref)
    assert _same_bits(q, q_ref)


@pytest.mark.parametrize("fp8_dtype", FP8_DTYPES)
def test_quantize_fp8_with_a_static_scale_saturates_like_the_reference(triton_ops, reference_ops, fp8_dtype):
    x = _randn(2, 64) * 100
    static = torch.tensor([[0.1]])
    q, scales = triton_ops.quantize_fp8(x, static, mode="per_tensor", fp8_dtype=fp8_dtype)
    q_ref, _ = reference_ops.quantize_fp8(x, static, mode="per_tensor", fp8_dtype=fp8_dtype)
    assert torch.equal(scales, static) and _same_bits(q, q_ref)
    assert q.float().abs().max() == FP8_MAX[fp8_dtype]


def _operands(m: int, n: int, k: int, fp8_dtype: torch.dtype, scale_mode: str) -> tuple[torch.Tensor, ...]:
    a, b = (_randn(m, k) * 8).to(fp8_dtype), (_randn(n, k, seed=1) * 8).to(fp8_dtype)
    shapes = {
        "tensor": ((1, 1), (1, 1)),
        "row": ((m, 1), (n, 1)),
        "block": ((m, -(-k // 128)), (-(-n // 128), -(-k // 128))),
    }[scale_mode]
    a_scale = _randn(*shapes[0], seed=2).abs().float() + 0.1
    b_scale = _randn(*shapes[1], seed=3).abs().float() + 0.1
    return a, b, a_scale, b_scale


@pytest.mark.parametrize("fp8_dtype", FP8_DTYPES)
@pytest.mark.parametrize("scale_mode", ["tensor", "row", "block"])
def test_scaled_mm_matches_reference(assert_matches_reference, scale_mode, fp8_dtype):
    # K spans two 128-wide scale groups, the second partial; N spans two 128 row tiles.
    a, b, a_scale, b_scale = _operands(5, 130, 200, fp8_dtype, scale_mode)
    assert_matches_reference("scaled_mm", a, b, a_scale, b_scale, scale_mode=scale_mode)


@pytest.mark.parametrize("out_dtype", FLOAT_DTYPES)
def test_scaled_mm_adds_the_bias_and_rounds_to_out_dtype(assert_matches_reference, out_dtype):
    a, b, a_scale, b_scale = _operands(3, 24, 40, torch.float8_e4m3fn, "row")
    bias = _randn(24, seed=4).to(out_dtype)
    assert_matches_reference("scaled_mm", a, b, a_scale, b_scale, bias, scale_mode="row", out_dtype=out_dtype)
