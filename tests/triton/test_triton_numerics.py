"""The rounding every Triton kernel stores through gives torch's round-to-nearest-even
casts bit for bit (ties, subnormals, saturation and signed zeros included), which is
what keeps the interpreter's truncating bf16 and mis-rounding fp8 casts out of results."""

from __future__ import annotations

import pytest
import torch

from accord.op_contracts import FP8_DTYPES, FP8_MAX

triton = pytest.importorskip("triton")
tl = pytest.importorskip("triton.language")
from accord.backends.triton.kernels._numerics import store_rounded  # noqa: E402


@triton.jit
def _store_kernel(x_ptr, out_ptr, n, BLOCK: tl.constexpr):
    offsets = tl.arange(0, BLOCK)
    store_rounded(out_ptr + offsets, tl.load(x_ptr + offsets, mask=offsets < n), offsets < n)


@pytest.fixture(scope="module")
def store_through_kernel(triton_ops):
    """A function storing an fp32 vector into a new tensor of a dtype via store_rounded
    (on the interpreter: triton_ops skips the module otherwise)."""

    def store(x: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
        out = torch.empty(x.numel(), dtype=dtype)
        _store_kernel[(1,)](x, out, x.numel(), BLOCK=triton.next_power_of_2(x.numel()))
        return out

    return store


def _hard_values() -> torch.Tensor:
    """Random magnitudes over many binades, exact ties of the bf16 and fp8 grids,
    fp8 subnormals, values past the fp8 range and both zeros."""
    g = torch.Generator().manual_seed(0)
    spread = torch.randn(2048, generator=g) * torch.exp2(torch.randint(-14, 10, (2048,), generator=g).float())
    bf16_ties = torch.tensor([1.0 + 2.0**-8, 1.0 + 3 * 2.0**-8, -(1.0 + 2.0**-8)])
    fp8_ties = torch.tensor([1.0625, 1.1875, -31.0, 2.0**-10, 3 * 2.0**-10, 2.0**-11, 7.88, -31.6])
    edges = torch.tensor([0.0, -0.0, 448.0, 460.0, 1e6, -1e6, 240.0, 250.0, -1e-7])
    return torch.cat([spread, bf16_ties, fp8_ties, edges])


def _bits(t: torch.Tensor) -> torch.Tensor:
    return t.view({1: torch.uint8, 2: torch.int16, 4: torch.int32}[t.element_size()])


# Past fp16's range the value becomes inf, as in torch; numpy warns about it.
@pytest.mark.filterwarnings("ignore:overflow encountered in cast:RuntimeWarning")
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16, torch.float32])
def test_float_stores_round_to_nearest_even_like_torch(store_through_kernel, dtype):
    x = _hard_values()
    assert torch.equal(_bits(store_through_kernel(x, dtype)), _bits(x.to(dtype)))


@pytest.mark.parametrize("dtype", FP8_DTYPES)
def test_fp8_stores_saturate_and_round_like_torch(store_through_kernel, dtype):
    x = _hard_values()
    limit = FP8_MAX[dtype]
    assert torch.equal(_bits(store_through_kernel(x, dtype)), _bits(x.clamp(-limit, limit).to(dtype)))
