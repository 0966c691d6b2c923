"""rms_norm, fused_add_rms_norm, rotary_embedding and silu_and_mul on torch-npu's fused
operators. Their dtype sets match the contracts (fp16/bf16/fp32), so no adapter is
needed; rotary runs the operator in fp32 because npu_rotary_mul takes its angle tables
at the input's dtype and the contract computes in fp32 (an exact widening)."""

from __future__ import annotations

from functools import partial
from typing import Any

import torch

from ....op_contracts import KernelSet


def rms_norm(npu: Any, x: torch.Tensor, weight: torch.Tensor, eps: float, out: torch.Tensor) -> None:
    """npu_rms_norm(x, weight, eps): y at x's dtype (the rstd output is unused)."""
    out.copy_(npu.npu_rms_norm(x, weight, eps)[0])


def fused_add_rms_norm(
    npu: Any, x: torch.Tensor, residual: torch.Tensor, weight: torch.Tensor, eps: float, out: torch.Tensor, residual_out: torch.Tensor
) -> None:
    """npu_add_rms_norm(x, residual, weight, eps): (y, rstd, x + residual)."""
    normed, _, summed = npu.npu_add_rms_norm(x, residual, weight, eps)
    out.copy_(normed)
    residual_out.copy_(summed)


def _angle_tables(cos_sin_cache: torch.Tensor, positions: torch.Tensor, is_neox: bool) -> tuple[torch.Tensor, torch.Tensor]:
    """r1 (cos) and r2 (sin) as npu_rotary_mul reads them: [1, T, 1, R] (BSND's 1S1D
    broadcast), each angle repeated for both members of its pair."""
    half = cos_sin_cache.shape[1] // 2
    angles = cos_sin_cache.index_select(0, positions)
    cos, sin = angles[:, :half], angles[:, half:]
    if is_neox:  # pairs (i, i + R/2)
        cos, sin = torch.cat((cos, cos), dim=-1), torch.cat((sin, sin), dim=-1)
    else:  # pairs (2i, 2i + 1)
        cos, sin = cos.repeat_interleave(2, dim=-1), sin.repeat_interleave(2, dim=-1)
    return cos[None, :, None, :].contiguous(), sin[None, :, None, :].contiguous()


def _rotate_heads(npu: Any, x: torch.Tensor, r1: torch.Tensor, r2: torch.Tensor, mode: str, out: torch.Tensor) -> None:
    rotary_dim = r1.shape[-1]
    rotated = npu.npu_rotary_mul(x[None, :, :, :rotary_dim].float().contiguous(), r1, r2, mode)[0]
    out[..., :rotary_dim] = rotated
    out[..., rotary_dim:] = x[..., rotary_dim:]


def rotary_embedding(
    npu: Any,
    positions: torch.Tensor,
    query: torch.Tensor,
    key: torch.Tensor,
    cos_sin_cache: torch.Tensor,
    is_neox: bool,
    query_out: torch.Tensor,
    key_out: torch.Tensor,
) -> None:
    """npu_rotary_mul on BSND views [1, T, H, R] of the rotated dims, in fp32, 'half'
    mode for neox pairs and 'interleave' for gpt-j pairs; dims past R pass through."""
    r1, r2 = _angle_tables(cos_sin_cache, positions, is_neox)
    mode = "half" if is_neox else "interleave"
    _rotate_heads(npu, query, r1, r2, mode, query_out)
    _rotate_heads(npu, key, r1, r2, mode, key_out)


def silu_and_mul(npu: Any, x: torch.Tensor, out: torch.Tensor) -> None:
    """npu_swiglu(x, dim=-1): silu of the first half times the second."""
    out.copy_(npu.npu_swiglu(x, dim=-1))


def register(kernels: KernelSet, npu: Any) -> None:
    """Add this family's kernels, calling operators on `npu` (torch_npu or the emulator)."""
    kernels.register("rms_norm")(partial(rms_norm, npu))
    kernels.register("fused_add_rms_norm")(partial(fused_add_rms_norm, npu))
    kernels.register("rotary_embedding")(partial(rotary_embedding, npu))
    kernels.register("silu_and_mul")(partial(silu_and_mul, npu))
