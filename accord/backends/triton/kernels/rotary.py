"""Rotary position embedding (neox and gpt-j pairings, partial rotary): one program
per token rotates all its heads as one [heads, pairs] tile; launched once for the
queries and once for the keys."""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from ._numerics import store_rounded
from ._registry import KERNELS


@triton.jit
def _rotary_kernel(
    positions_ptr, x_ptr, cos_sin_ptr, out_ptr, heads, head_dim, half,
    IS_NEOX: tl.constexpr, BLOCK_HEADS: tl.constexpr, BLOCK_HALF: tl.constexpr, BLOCK_DIM: tl.constexpr,
):
    token = tl.program_id(0).to(tl.int64)
    head = tl.arange(0, BLOCK_HEADS)[:, None]
    rows = (token * heads + head) * head_dim
    # The position is read at positions' own width, then widened for the address.
    angles = cos_sin_ptr + tl.load(positions_ptr + token).to(tl.int64) * 2 * half
    pair = tl.arange(0, BLOCK_HALF)[None, :]
    in_pair = (head < heads) & (pair < half)
    cos = tl.load(angles + pair, mask=pair < half)
    sin = tl.load(angles + half + pair, mask=pair < half)
    if IS_NEOX:
        first, second = pair, pair + half
    else:
        first, second = 2 * pair, 2 * pair + 1
    a = tl.load(x_ptr + rows + first, mask=in_pair).to(tl.float32)
    b = tl.load(x_ptr + rows + second, mask=in_pair).to(tl.float32)
    store_rounded(out_ptr + rows + first, a * cos - b * sin, in_pair)
    store_rounded(out_ptr + rows + second, b * cos + a * sin, in_pair)
    tail = tl.arange(0, BLOCK_DIM)[None, :]
    passes = (head < heads) & (tail >= 2 * half) & (tail < head_dim)
    tl.store(out_ptr + rows + tail, tl.load(x_ptr + rows + tail, mask=passes), mask=passes)


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
    """Rotate the first R dims of every query and key head by its token's angles."""
    half = cos_sin_cache.shape[1] // 2
    for source, target in ((query, query_out), (key, key_out)):
        tokens, heads, head_dim = source.shape
        if tokens and heads:
            _rotary_kernel[(tokens,)](
                positions, source, cos_sin_cache, target, heads, head_dim, half,
                IS_NEOX=is_neox,
                BLOCK_HEADS=triton.next_power_of_2(heads),
                BLOCK_HALF=triton.next_power_of_2(half),
                BLOCK_DIM=triton.next_power_of_2(head_dim),
            )
