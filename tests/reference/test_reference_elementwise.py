"""rms_norm, fused_add_rms_norm, rotary_embedding and silu_and_mul against
transformers' Llama layers and textbook formulations."""

from __future__ import annotations

import pytest
import torch
from transformers.models.llama.modeling_llama import LlamaRMSNorm, apply_rotary_pos_emb

TOKENS, HIDDEN = 5, 16


def _llama_rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    norm = LlamaRMSNorm(x.shape[-1], eps=eps)
    with torch.no_grad():
        norm.weight.copy_(weight)
        return norm(x)


def test_rms_norm_matches_llama_rms_norm(ops) -> None:
    x, weight = torch.randn(TOKENS, HIDDEN), torch.rand(HIDDEN) + 0.5
    torch.testing.assert_close(ops.rms_norm(x, weight, eps=1e-5), _llama_rms_norm(x, weight, 1e-5))


def test_fused_add_rms_norm_returns_the_sum_and_its_llama_norm(ops) -> None:
    x, residual, weight = torch.randn(TOKENS, HIDDEN), torch.randn(TOKENS, HIDDEN), torch.rand(HIDDEN) + 0.5
    out, residual_out = ops.fused_add_rms_norm(x, residual, weight, eps=1e-6)
    torch.testing.assert_close(residual_out, x + residual)
    torch.testing.assert_close(out, _llama_rms_norm(x + residual, weight, 1e-6))


def _angles(positions: int, rotary_dim: int) -> torch.Tensor:
    """[positions, rotary_dim / 2] rotation angles with the usual 10000^(-2i/R) frequencies."""
    inv_freq = 1.0 / 10000 ** (torch.arange(0, rotary_dim, 2, dtype=torch.float64) / rotary_dim)
    return torch.outer(torch.arange(positions, dtype=torch.float64), inv_freq)


def _cos_sin_cache(angles: torch.Tensor) -> torch.Tensor:
    return torch.cat([angles.cos(), angles.sin()], dim=-1).float()


@pytest.mark.parametrize("rotary_dim", [8, 4])  # 4 < head dim 8: partial rotary
@pytest.mark.parametrize("index_dtype", [torch.int32, torch.int64])
def test_neox_rotary_matches_transformers_apply_rotary_pos_emb(ops, rotary_dim, index_dtype) -> None:
    angles = _angles(32, rotary_dim)
    positions = torch.tensor([0, 7, 3, 31, 12], dtype=index_dtype)
    query, key = torch.randn(TOKENS, 4, 8), torch.randn(TOKENS, 2, 8)
    query_out, key_out = ops.rotary_embedding(positions, query, key, _cos_sin_cache(angles), is_neox=True)
    # transformers' cos/sin repeat the half-width table across both halves.
    theta = angles[positions.long()].repeat(1, 2).float()
    hf_query, hf_key = apply_rotary_pos_emb(query[..., :rotary_dim], key[..., :rotary_dim], theta.cos(), theta.sin())
    torch.testing.assert_close(query_out[..., :rotary_dim], hf_query)
    torch.testing.assert_close(key_out[..., :rotary_dim], hf_key)
    assert torch.equal(query_out[..., rotary_dim:], query[..., rotary_dim:])
    assert torch.equal(key_out[..., rotary_dim:], key[..., rotary_dim:])


def test_gptj_rotary_multiplies_adjacent_pairs_as_complex_numbers_by_unit_phasors(ops) -> None:
    rotary_dim = 8
    angles = _angles(16, rotary_dim)
    positions = torch.tensor([1, 0, 15, 4, 9])
    query, key = torch.randn(TOKENS, 2, rotary_dim), torch.randn(TOKENS, 1, rotary_dim)
    query_out, key_out = ops.rotary_embedding(positions, query, key, _cos_sin_cache(angles), is_neox=False)
    phasors = torch.polar(torch.ones_like(angles), angles)[positions][:, None]  # [T, 1, R/2]
    for source, rotated in ((query, query_out), (key, key_out)):
        as_complex = torch.view_as_complex(source.double().reshape(*source.shape[:-1], -1, 2).contiguous())
        expected = torch.view_as_real(as_complex * phasors).flatten(-2)
        torch.testing.assert_close(rotated.double(), expected, rtol=1e-5, atol=1e-6)


def test_silu_and_mul_gates_the_second_half_with_silu_of_the_first(ops) -> None:
    gate, up = torch.randn(TOKENS, HIDDEN), torch.randn(TOKENS, HIDDEN)
    out = ops.silu_and_mul(torch.cat([gate, up], dim=1))
    torch.testing.assert_close(out, gate * torch.sigmoid(gate) * up)
