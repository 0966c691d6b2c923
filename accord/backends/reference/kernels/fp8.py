"""Reference FP8 quantisation (per tensor, per token, per 128-wide group) and the
scaled matmul (per-tensor, per-row and block scales), dequantising to fp64."""

from __future__ import annotations

import torch

from ....op_contracts import FP8_MAX
from . import _fp8
from ._registry import KERNELS

#: Smallest scale denominator: an all-zero granule still gets a finite scale.
MIN_AMAX = 1e-10
#: DeepSeek's block scales: 1x128 groups of activations, 128x128 tiles of weights.
BLOCK = 128


def _amax(x: torch.Tensor, mode: str, group_size: int) -> torch.Tensor:
    """max(|x|) per granule, shaped like the scales. A zero is padded in before each
    reduction so empty granules give 0 (|x| >= 0, so the max is otherwise unchanged)."""
    magnitude = x.abs()
    if mode == "per_tensor":
        return torch.nn.functional.pad(magnitude.flatten(), (0, 1)).amax().reshape(1, 1)
    if mode == "per_token":
        return torch.nn.functional.pad(magnitude, (0, 1)).amax(dim=1, keepdim=True)
    tokens, hidden = x.shape
    groups = -(-hidden // group_size)
    padded = torch.nn.functional.pad(magnitude, (0, groups * group_size - hidden))
    return padded.view(tokens, groups, group_size).amax(dim=-1)


@KERNELS.register("quantize_fp8")
def quantize_fp8(
    x: torch.Tensor,
    scale: torch.Tensor | None,
    mode: str,
    group_size: int,
    fp8_dtype: torch.dtype,
    q: torch.Tensor,
    scales: torch.Tensor,
) -> None:
    """Quantise x to fp8 with dynamic (or a static per-tensor) fp32 scales."""
    x32 = x.float()
    limit = FP8_MAX[fp8_dtype]
    if scale is not None:
        scales.copy_(scale)
    else:
        scales.copy_(_amax(x32, mode, group_size).clamp_min(MIN_AMAX) / limit)
    per_element = scales  # per-tensor and per-token scales broadcast over x
    if mode == "per_group":
        per_element = _fp8.expand_blocks(scales, 1, group_size, *x.shape)
    q.copy_((x32 / per_element).clamp(-limit, limit).to(fp8_dtype))


def _dequantise(stored: torch.Tensor, scale: torch.Tensor, block_rows: int, scale_mode: str) -> torch.Tensor:
    """`stored * scale` in fp64; per-tensor and per-row scales broadcast, block scales
    cover `block_rows` x 128 elements each."""
    values = stored.double()
    if scale_mode != "block":
        return values * scale.double()
    rows, cols = values.shape
    return values * _fp8.expand_blocks(scale.double(), block_rows, BLOCK, rows, cols)


@KERNELS.register("scaled_mm")
def scaled_mm(
    a: torch.Tensor,
    b: torch.Tensor,
    a_scale: torch.Tensor,
    b_scale: torch.Tensor,
    bias: torch.Tensor | None,
    scale_mode: str,
    out_dtype: torch.dtype,
    out: torch.Tensor,
) -> None:
    """Dequantise both fp8 operands and multiply like F.linear, bias added in fp64."""
    product = _dequantise(a, a_scale, 1, scale_mode) @ _dequantise(b, b_scale, BLOCK, scale_mode).T
    if bias is not None:
        product = product + bias.double()
    out.copy_(product)
