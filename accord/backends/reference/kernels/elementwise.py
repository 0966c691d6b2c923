"""Reference RMS norm, fused add + RMS norm, rotary embedding and SiLU-and-mul."""

from __future__ import annotations

import torch

from ._registry import KERNELS


def _rms(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    x64 = x.double()
    return x64 * torch.rsqrt(x64.pow(2).mean(-1, keepdim=True) + eps) * weight.double()


@KERNELS.register("rms_norm")
def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float, out: torch.Tensor) -> None:
    out.copy_(_rms(x, weight, eps))


@KERNELS.register("fused_add_rms_norm")
def fused_add_rms_norm(
    x: torch.Tensor,
    residual: torch.Tensor,
    weight: torch.Tensor,
    eps: float,
    out: torch.Tensor,
    residual_out: torch.Tensor,
) -> None:
    residual_out.copy_(x.double() + residual.double())
    # The norm reads the stored (rounded) sum, as the next layer's residual will.
    out.copy_(_rms(residual_out, weight, eps))


@KERNELS.register("rotary_embedding")
def rotary_embedding(
    positions: torch.Tensor,
    query: torch.Tensor,
    key: torch.Tensor,
    cos_sin_cache: torch.Tensor,
    is_neox: bool,
    query_out: torch.Tensor,
    key_out: torch.Tensor,
) -> None:
    rotary_dim = cos_sin_cache.shape[1]
    half = rotary_dim // 2
    table = cos_sin_cache.double()[positions.long()]
    cos, sin = table[:, None, :half], table[:, None, half:]
    for source, target in ((query, query_out), (key, key_out)):
        x = source.double()
        rot = x[..., :rotary_dim]
        if is_neox:
            first, second = rot[..., :half], rot[..., half:]
        else:
            first, second = rot[..., 0::2], rot[..., 1::2]
        new_first = first * cos - second * sin
        new_second = second * cos + first * sin
        if is_neox:
            rotated = torch.cat([new_first, new_second], dim=-1)
        else:
            rotated = torch.stack([new_first, new_second], dim=-1).flatten(-2)
        target.copy_(torch.cat([rotated, x[..., rotary_dim:]], dim=-1))


@KERNELS.register("silu_and_mul")
def silu_and_mul(x: torch.Tensor, out: torch.Tensor) -> None:
    half = x.shape[1] // 2
    x64 = x.double()
    out.copy_(torch.nn.functional.silu(x64[:, :half]) * x64[:, half:])
