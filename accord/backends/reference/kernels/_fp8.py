"""FP8 conversions shared by the reference kernels: saturating stores, scaled reads and
the expansion of block scales to one scale per element."""

from __future__ import annotations

import torch

from ....op_contracts import FP8_DTYPES, FP8_MAX


def store(values: torch.Tensor, scale: float, dtype: torch.dtype) -> torch.Tensor:
    """`values` as a cache of `dtype` holds them: divided by `scale` in fp32 and
    saturated to the fp8 range when `dtype` is fp8, unchanged otherwise."""
    if dtype not in FP8_DTYPES:
        return values.to(dtype)
    limit = FP8_MAX[dtype]
    return (values.float() / scale).clamp(-limit, limit).to(dtype)


def load(stored: torch.Tensor, scale: float) -> torch.Tensor:
    """`stored` cache contents as fp64 values: times `scale` when fp8, exact otherwise."""
    values = stored.double()
    return values * scale if stored.dtype in FP8_DTYPES else values


def expand_blocks(scale: torch.Tensor, block_rows: int, block_cols: int, rows: int, cols: int) -> torch.Tensor:
    """A [rows, cols] table giving each element the scale of its block (block scales
    cover `block_rows` x `block_cols` elements; the last block may be partial)."""
    return scale.repeat_interleave(block_rows, 0)[:rows].repeat_interleave(block_cols, 1)[:, :cols]
