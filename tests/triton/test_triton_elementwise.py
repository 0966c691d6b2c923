"""The Triton per-token kernels (RMS norm, fused add + RMS norm, SiLU-and-mul, rotary)
match the reference backend on every float dtype and index width they claim."""

from __future__ import annotations

import pytest
import torch

from accord.op_contracts import FLOAT_DTYPES, INDEX_DTYPES


def _randn(*shape: int, dtype: torch.dtype, seed: int = 0) -> torch.Tensor:
    return torch.randn(*shape, generator=torch.Generator().manual_seed(seed)).to(dtype)


@pytest.mark.parametrize("dtype", FLOAT_DTYPES)
def test_rms_norm_matches_reference(assert_matches_reference, dtype):
    x, weight = _randn(3, 40, dtype=dtype), _randn(40, dtype=dtype, seed=1)
    assert_matches_reference("rms_norm", x, weight, eps=1e-6)


@pytest.mark.parametrize("dtype", FLOAT_DTYPES)
def test_fused_add_rms_norm_matches_reference(assert_matches_reference, dtype):
    x, residual = _randn(3, 40, dtype=dtype), _randn(3, 40, dtype=dtype, seed=1)
    assert_matches_reference("fused_add_rms_norm", x, residual, _randn(40, dtype=dtype, seed=2), eps=1e-5)


def test_fused_add_rms_norm_stores_the_correctly_rounded_bf16_sum(triton_ops):
    x, residual = _randn(4, 64, dtype=torch.bfloat16), _randn(4, 64, dtype=torch.bfloat16, seed=1)
    _, residual_out = triton_ops.fused_add_rms_norm(x, residual, torch.ones(64, dtype=torch.bfloat16))
    assert torch.equal(residual_out, (x.float() + residual.float()).to(torch.bfloat16))


@pytest.mark.parametrize("dtype", FLOAT_DTYPES)
def test_silu_and_mul_matches_reference(assert_matches_reference, dtype):
    assert_matches_reference("silu_and_mul", _randn(3, 2 * 24, dtype=dtype))


def test_silu_and_mul_of_zero_tokens_returns_an_empty_output(triton_ops):
    assert triton_ops.silu_and_mul(torch.empty(0, 8)).shape == (0, 4)


@pytest.mark.parametrize("is_neox", [True, False])
@pytest.mark.parametrize("dtype", FLOAT_DTYPES)
@pytest.mark.parametrize("positions_dtype", INDEX_DTYPES)
def test_rotary_embedding_matches_reference(assert_matches_reference, dtype, positions_dtype, is_neox):
    positions = torch.tensor([5, 0, 17], dtype=positions_dtype)
    query, key = _randn(3, 4, 16, dtype=dtype), _randn(3, 2, 16, dtype=dtype, seed=1)
    cos_sin_cache = _randn(20, 16, dtype=torch.float32, seed=2)
    assert_matches_reference("rotary_embedding", positions, query, key, cos_sin_cache, is_neox=is_neox)


def test_partial_rotary_passes_the_dims_past_the_rotary_dim_through_unchanged(triton_ops):
    query, key = _randn(2, 2, 16, dtype=torch.bfloat16), _randn(2, 1, 16, dtype=torch.bfloat16, seed=1)
    query_out, key_out = triton_ops.rotary_embedding(
        torch.tensor([3, 1]), query, key, _randn(8, 6, dtype=torch.float32)
    )
    assert torch.equal(query_out[..., 6:], query[..., 6:]) and torch.equal(key_out[..., 6:], key[..., 6:])


def test_partial_rotary_matches_reference(assert_matches_reference):
    query, key = _randn(2, 3, 20, dtype=torch.float16), _randn(2, 1, 20, dtype=torch.float16, seed=1)
    assert_matches_reference("rotary_embedding", torch.tensor([3, 1]), query, key, _randn(8, 12, dtype=torch.float32))
