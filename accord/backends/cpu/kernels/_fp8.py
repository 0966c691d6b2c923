"""FP8 conversions of the cpu kernels: saturating cache stores and block-scale
dequantisation (weight tiles and activation groups)."""

from __future__ import annotations

import torch

from ....op_contracts import FP8_DTYPES, FP8_MAX


def as_stored(values: torch.Tensor, scale: float, dtype: torch.dtype) -> torch.Tensor:
    """`values` as a cache of `dtype` holds them: divided by `scale` in fp32 and
    saturated to the fp8 range for an fp8 cache (the same division as the reference,
    so the stored bits agree); unchanged for a cache of the values' own dtype."""
    if dtype not in FP8_DTYPES:
        return values
    limit = FP8_MAX[dtype]
    return (values.float() / scale).clamp_(-limit, limit).to(dtype)


def dequantise_blocks(stored: torch.Tensor, scale: torch.Tensor, block_rows: int, block_cols: int) -> torch.Tensor:
    """A [rows, cols] fp8 tensor in fp32, each `block_rows` x `block_cols` block times
    its scale (the last block of a row or column may be partial)."""
    rows, cols = stored.shape
    values = stored.float()
    if rows % block_rows == 0 and cols % block_cols == 0:
        blocks = values.view(rows // block_rows, block_rows, cols // block_cols, block_cols)
        blocks.mul_(scale[:, None, :, None])
        return values
    per_element = scale.repeat_interleave(block_rows, 0)[:rows].repeat_interleave(block_cols, 1)[:, :cols]
    return values.mul_(per_element)
