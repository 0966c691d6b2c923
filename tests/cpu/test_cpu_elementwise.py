"""cpu RMS norm, fused add + RMS norm, rotary embedding and SiLU-and-mul against the
reference, in fp32 (computed in place in the outputs) and in the half types."""

from __future__ import annotations

import pytest
import torch

DTYPES = [torch.float32, torch.bfloat16, torch.float16]


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
