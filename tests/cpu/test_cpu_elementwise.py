"""cpu RMS norm, fused add + RMS norm, rotary embedding and SiLU-and-mul against the
reference, in fp32 (computed in place in the outputs) and in the half types, on the C
kernels and on the torch path alike (the `glue_path` fixture)."""

from __future__ import annotations

import pytest
import torch

from accord.backends import get_backend
from accord.op_contracts import OpDispatcher

DTYPES = [torch.float32, torch.bfloat16, torch.float16]

pytestmark = pytest.mark.usefixtures("glue_path")


@pytest.mark.parametrize("dtype", DTYPES)
def test_rms_norm_matches_reference(assert_matches_reference, dtype) -> None:
    x, weight = torch.randn(5, 64).to(dtype), torch.randn(64).to(dtype)
    assert_matches_reference("rms_norm", x, weight, eps=1e-5)


@pytest.mark.parametrize("dtype", DTYPES)
def test_fused_add_rms_norm_matches_reference(assert_matches_reference, dtype) -> None:
    x, residual, weight = torch.randn(5, 64).to(dtype), torch.randn(5, 64).to(dtype), torch.randn(64).to(dtype)
    assert_matches_reference("fused_add_rms_norm", x, residual, weight, eps=1e-6)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("is_neox", [True, False])
@pytest.mark.parametrize("rotary_dim", [16, 8])  # whole head, and partial rotary
def test_rotary_embedding_matches_reference(assert_matches_reference, dtype, is_neox, rotary_dim) -> None:
    positions = torch.tensor([0, 7, 3, 31, 7], dtype=torch.int32)
    query, key = torch.randn(5, 4, 16).to(dtype), torch.randn(5, 2, 16).to(dtype)
    cos_sin_cache = torch.randn(32, rotary_dim)
    assert_matches_reference("rotary_embedding", positions, query, key, cos_sin_cache, is_neox=is_neox)


@pytest.mark.parametrize("dtype", DTYPES)
def test_silu_and_mul_matches_reference(assert_matches_reference, dtype) -> None:
    assert_matches_reference("silu_and_mul", torch.randn(5, 2 * 48).to(dtype))


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("tokens,hidden", [(3, 37), (80, 1024)])  # vector tails; rows split over threads
def test_norms_at_odd_widths_and_prefill_sizes_match_reference(assert_matches_reference, dtype, tokens, hidden) -> None:
    x, residual = (torch.randn(tokens, hidden).to(dtype) for _ in range(2))
    weight = torch.randn(hidden).to(dtype)
    assert_matches_reference("rms_norm", x, weight, eps=1e-6)
    assert_matches_reference("fused_add_rms_norm", x, residual, weight, eps=1e-6)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("is_neox", [True, False])
def test_rotary_at_prefill_sizes_matches_reference(assert_matches_reference, dtype, is_neox) -> None:
    positions = torch.randint(0, 300, (64,))
    query, key = torch.randn(64, 16, 64).to(dtype), torch.randn(64, 4, 64).to(dtype)
    assert_matches_reference("rotary_embedding", positions, query, key, torch.randn(300, 48), is_neox=is_neox)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("tokens,intermediate", [(3, 13), (40, 2816)])
def test_silu_and_mul_at_odd_widths_and_prefill_sizes_matches_reference(
    assert_matches_reference, dtype, tokens, intermediate
) -> None:
    assert_matches_reference("silu_and_mul", torch.randn(tokens, 2 * intermediate).to(dtype))


@pytest.mark.parametrize("dtype", DTYPES)
def test_silu_and_mul_saturates_like_the_reference_on_large_gates(assert_matches_reference, dtype) -> None:
    """Gates past the range of the C kernel's exp polynomial (|g| > 87) and near it, each
    output within a rounding of the reference (relative, as the outputs span 1e-36..1e4;
    subnormal outputs only to within the smallest normal)."""
    gate = torch.tensor([[-1e4, -300.0, -100.0, -88.0, -86.9, -20.0, 0.0, 20.0, 86.9, 88.0, 100.0, 1e4]])
    got, want = assert_matches_reference("silu_and_mul", torch.cat([gate, torch.rand_like(gate) + 0.5], 1).to(dtype))
    rtol = {torch.float32: 1e-6, torch.bfloat16: 2**-8, torch.float16: 2**-11}[dtype]
    torch.testing.assert_close(got, want, rtol=rtol, atol=torch.finfo(dtype).tiny)


def test_rotary_position_past_the_table_is_refused_not_read(cpu_ops) -> None:
    """The C kernel reads the table inside: a position past it must raise (as torch's
    index_select does on the torch path), never read past the table."""
    query, key = torch.randn(2, 4, 16), torch.randn(2, 2, 16)
    with pytest.raises(IndexError):
        cpu_ops.rotary_embedding(torch.tensor([0, 32]), query, key, torch.randn(32, 16), is_neox=True)


def test_norm_sizes_that_disagree_raise_on_a_fast_path_too() -> None:
    """A dispatcher's fast path validates only a signature's first call: a later call
    whose weight is shorter than its rows must still raise, not read out of bounds."""
    ops = OpDispatcher(get_backend("cpu"))
    ops.fused_add_rms_norm(torch.randn(2, 64), torch.randn(2, 64), torch.randn(64), eps=1e-6)
    with pytest.raises(RuntimeError):
        ops.fused_add_rms_norm(torch.randn(2, 64), torch.randn(2, 64), torch.randn(16), eps=1e-6)
