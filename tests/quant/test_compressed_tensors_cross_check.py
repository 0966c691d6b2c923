"""accord's reading of compressed-tensors' pack-quantized tensors (a safetensors file
read through the loader's checkpoint view), dequantised by the reference kernel's fp64
definition, equals compressed-tensors' own decompressor bit for bit (after the one
rounding to the scales' dtype both make), for 4 and 8 bits, symmetric and asymmetric,
group 32, 128 and per channel, whole and as tensor-parallel shards; the cpu kernel's
product matches x @ that weight."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from compressed_tensors_writer import compress, decompress, scheme
from safetensors.torch import save_file

from accord.backends import get_backend
from accord.backends.reference.kernels.group_quant import dequantize
from accord.core.model_loader.group_quant.checkpoint import GroupQuantCheckpoint
from accord.core.model_loader.group_quant.scheme import COMPRESSED_TENSORS, GroupQuantScheme
from accord.core.model_loader.hf_checkpoint import SafetensorsCheckpoint
from accord.op_contracts import OpDispatcher

CASES = [
    (bits, symmetric, group_size, dtype)
    for bits in (4, 8)
    for symmetric in (True, False)
    for group_size, dtype in ((32, torch.bfloat16), (128, torch.float16), (-1, torch.bfloat16))
]


ROWS, DEPTH = 48, 256


def stored_weight(tmp_path: Path, bits: int, symmetric: bool, group_size: int, dtype: torch.dtype, shard=(0, 0, ROWS)):
    """(the tensors compressed-tensors wrote, its scheme, accord's `shard` (dim, start,
    stop) of the weight, read packed from those tensors saved as a checkpoint)."""
    weight = torch.randn(ROWS, DEPTH, generator=torch.Generator().manual_seed(bits * 100 + group_size)).to(dtype)
    chosen = scheme(bits, symmetric, group_size)
    state = compress(weight, chosen)
    save_file({f"layer.{name}": tensor.contiguous() for name, tensor in state.items()}, tmp_path / "model.safetensors")
    checkpoint = GroupQuantCheckpoint(
        SafetensorsCheckpoint(tmp_path), GroupQuantScheme(COMPRESSED_TENSORS, bits, group_size, symmetric)
    )
    read = checkpoint.read_packed("layer.weight", *shard)
    assert read is not None
    return state, chosen, read


def dense(weight) -> torch.Tensor:
    """The reference kernel's fp64 dequantisation of a read weight."""
    return dequantize(
        weight.qweight, weight.scales, weight.zeros, weight.g_idx, weight.bits, weight.group_size, weight.in_features
    )


@pytest.mark.parametrize(("bits", "symmetric", "group_size", "dtype"), CASES)
def test_reference_dequantisation_equals_the_decompressor(tmp_path: Path, bits, symmetric, group_size, dtype) -> None:
    state, chosen, weight = stored_weight(tmp_path, bits, symmetric, group_size, dtype)
    theirs = decompress(state, chosen)
    assert theirs.dtype == dtype
    assert torch.equal(dense(weight).to(dtype), theirs)


#: (dim, start, stop): a tp=2 rank's output rows and input channels, and rows off the
#: zero points' words of 8 (4-bit) or 4 (8-bit) rows.
SHARDS = [(0, 24, 48), (1, 128, 256), (0, 5, 23)]


@pytest.mark.parametrize("shard", SHARDS, ids=lambda s: f"dim{s[0]}[{s[1]}:{s[2]}]")
@pytest.mark.parametrize(("bits", "symmetric", "group_size", "dtype"), CASES)
def test_a_shard_equals_that_slice_of_the_decompressor(tmp_path: Path, bits, symmetric, group_size, dtype, shard):
    state, chosen, weight = stored_weight(tmp_path, bits, symmetric, group_size, dtype, shard)
    dim, start, stop = shard
    theirs = decompress(state, chosen).narrow(dim, start, stop - start)
    assert torch.equal(dense(weight).to(dtype), theirs)


@pytest.mark.parametrize(("bits", "symmetric", "group_size", "dtype"), CASES[:6])
def test_the_cpu_kernel_multiplies_by_the_decompressed_weight(tmp_path: Path, bits, symmetric, group_size, dtype):
    state, chosen, weight = stored_weight(tmp_path, bits, symmetric, group_size, dtype)
    x = torch.randn(5, 256, generator=torch.Generator().manual_seed(3))
    ops = OpDispatcher(get_backend("cpu"), strict=True)
    out = ops.group_quant_linear(
        x, weight.qweight, weight.scales, weight.zeros, weight.g_idx, None, bits=bits, group_size=group_size
    )
    # fp32 x: the kernel's weights are exact, the decompressor's rounded once to the
    # 16-bit scales dtype (2^-9 of each weight at bf16), so the products agree to that.
    want = x.double() @ decompress(state, chosen).double().t()
    assert ((out.double() - want).norm() / want.norm()).item() < 4e-3
