"""accord's reading of compressed-tensors' pack-quantized tensors, dequantised by the
reference kernel's fp64 definition, equals compressed-tensors' own decompressor bit for
bit (after the one rounding to the scales' dtype both make), for 4 and 8 bits,
symmetric and asymmetric, group 32, 128 and per channel; the cpu kernel's product
matches x @ that weight."""

from __future__ import annotations

import pytest
import torch
from compressed_tensors_writer import compress, decompress, scheme

from accord.backends import get_backend
from accord.backends.reference.kernels.group_quant import dequantize
from accord.core.model_loader.group_quant import compressed_tensors
from accord.core.model_loader.group_quant.scheme import COMPRESSED_TENSORS, GroupQuantScheme
from accord.op_contracts import OpDispatcher

CASES = [
    (bits, symmetric, group_size, dtype)
    for bits in (4, 8)
    for symmetric in (True, False)
    for group_size, dtype in ((32, torch.bfloat16), (128, torch.float16), (-1, torch.bfloat16))
]


class StoredTensors(dict):
    """A checkpoint of in-memory tensors (what the format reader asks of one)."""

    def read(self, name: str) -> torch.Tensor:
        return self[name]


def stored_weight(bits: int, symmetric: bool, group_size: int, dtype: torch.dtype):
    """(the tensors compressed-tensors wrote, its scheme, accord's weight read from them)."""
    weight = torch.randn(48, 256, generator=torch.Generator().manual_seed(bits * 100 + group_size)).to(dtype)
    chosen = scheme(bits, symmetric, group_size)
    state = compress(weight, chosen)
    tensors = StoredTensors({f"layer.{name}": tensor for name, tensor in state.items()})
    accord_scheme = GroupQuantScheme(COMPRESSED_TENSORS, bits, group_size, symmetric)
    return state, chosen, compressed_tensors.read(tensors, "layer", accord_scheme)  # type: ignore[arg-type]


@pytest.mark.parametrize(("bits", "symmetric", "group_size", "dtype"), CASES)
def test_reference_dequantisation_equals_the_decompressor(bits, symmetric, group_size, dtype) -> None:
    state, chosen, weight = stored_weight(bits, symmetric, group_size, dtype)
    theirs = decompress(state, chosen)
    ours = dequantize(weight.qweight, weight.scales, weight.zeros, weight.g_idx, bits, group_size, weight.in_features)
    assert theirs.dtype == dtype
    assert torch.equal(ours.to(dtype), theirs)


@pytest.mark.parametrize(("bits", "symmetric", "group_size", "dtype"), CASES[:6])
def test_the_cpu_kernel_multiplies_by_the_decompressed_weight(bits, symmetric, group_size, dtype) -> None:
    state, chosen, weight = stored_weight(bits, symmetric, group_size, dtype)
    x = torch.randn(5, 256, generator=torch.Generator().manual_seed(3))
    ops = OpDispatcher(get_backend("cpu"), strict=True)
    out = ops.group_quant_linear(
        x, weight.qweight, weight.scales, weight.zeros, weight.g_idx, None, bits=bits, group_size=group_size
    )
    # fp32 x: the kernel's weights are exact, the decompressor's rounded once to the
    # 16-bit scales dtype (2^-9 of each weight at bf16), so the products agree to that.
    want = x.double() @ decompress(state, chosen).double().t()
    assert ((out.double() - want).norm() / want.norm()).item() < 4e-3
