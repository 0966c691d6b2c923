"""Cases for the per-token ops: rms_norm, fused_add_rms_norm, rotary_embedding and
silu_and_mul, over one token, odd token counts and every float dtype."""

from __future__ import annotations

from typing import Iterator

import torch

from ...op_contracts import FLOAT_DTYPES, INDEX_DTYPES
from ..case import Case, randint, randn, seeded

#: (tokens, hidden): a single token, an odd count, and a width that is not a power of two.
TOKEN_SHAPES = ((1, 64), (7, 96))
#: An eps other than the default, and rows whose mean square is about eps (padding
#: and near-silent tokens): an ignored or hard-coded eps changes them visibly.
SMALL_EPS = 1e-3
SMALL_ROW_SCALE = SMALL_EPS**0.5


def rms_norm_cases(seed: int) -> Iterator[Case]:
    """x and weight at each float dtype."""
    for dtype in FLOAT_DTYPES:
        for tokens, hidden in TOKEN_SHAPES:
            g = seeded(seed, "rms_norm", dtype, tokens, hidden)
            args = {"x": randn(g, (tokens, hidden), dtype, 2.0), "weight": randn(g, (hidden,), dtype), "eps": 1e-6}
            yield Case("rms_norm", f"T={tokens} H={hidden}", args, row_independent=True)
        g = seeded(seed, "rms_norm small rows", dtype)
        args = {"x": randn(g, (4, 64), dtype, SMALL_ROW_SCALE), "weight": randn(g, (64,), dtype), "eps": SMALL_EPS}
        yield Case("rms_norm", f"T=4 H=64 mean square ~ eps={SMALL_EPS:g}", args, row_independent=True)


def fused_add_rms_norm_cases(seed: int) -> Iterator[Case]:
    """x, residual and weight at each float dtype."""
    for dtype in FLOAT_DTYPES:
        for tokens, hidden in TOKEN_SHAPES:
            g = seeded(seed, "fused_add_rms_norm", dtype, tokens, hidden)
            args = {
                "x": randn(g, (tokens, hidden), dtype),
                "residual": randn(g, (tokens, hidden), dtype, 3.0),
                "weight": randn(g, (hidden,), dtype),
                "eps": 1e-5,
            }
            yield Case("fused_add_rms_norm", f"T={tokens} H={hidden}", args, row_independent=True)
        g = seeded(seed, "fused_add_rms_norm small rows", dtype)
        args = {
            "x": randn(g, (4, 64), dtype, SMALL_ROW_SCALE / 2),
            "residual": randn(g, (4, 64), dtype, SMALL_ROW_SCALE / 2),
            "weight": randn(g, (64,), dtype),
            "eps": SMALL_EPS,
        }
        yield Case("fused_add_rms_norm", f"T=4 H=64 mean square ~ eps={SMALL_EPS:g}", args, row_independent=True)


def _cos_sin_cache(positions: int, rotary_dim: int) -> torch.Tensor:
    """The usual rope table: [positions, R] with cos in the first half, sin in the second."""
    inv_freq = 1.0 / (10000 ** (torch.arange(0, rotary_dim, 2, dtype=torch.float64) / rotary_dim))
    angles = torch.arange(positions, dtype=torch.float64)[:, None] * inv_freq
    return torch.cat([angles.cos(), angles.sin()], dim=-1).float()


#: (tokens, query heads, kv heads, head dim, rotary dim): full and partial rotary.
ROTARY_SHAPES = ((1, 2, 1, 32, 32), (6, 4, 2, 32, 16))
MAX_POSITION = 64


def rotary_embedding_cases(seed: int) -> Iterator[Case]:
    """Each float dtype x position width x layout, with full and partial rotary dims."""
    for dtype in FLOAT_DTYPES:
        for index_dtype in INDEX_DTYPES:
            for is_neox in (True, False):
                for tokens, q_heads, kv_heads, head_dim, rotary_dim in ROTARY_SHAPES:
                    g = seeded(seed, "rotary_embedding", dtype, index_dtype, is_neox, tokens, rotary_dim)
                    args = {
                        "positions": randint(g, MAX_POSITION, (tokens,), index_dtype),
                        "query": randn(g, (tokens, q_heads, head_dim), dtype),
                        "key": randn(g, (tokens, kv_heads, head_dim), dtype),
                        "cos_sin_cache": _cos_sin_cache(MAX_POSITION, rotary_dim),
                        "is_neox": is_neox,
                    }
                    layout = "neox" if is_neox else "gptj"
                    name = f"T={tokens} D={head_dim} R={rotary_dim} {layout}"
                    yield Case("rotary_embedding", name, args, row_independent=True)


def silu_and_mul_cases(seed: int) -> Iterator[Case]:
    """x at each float dtype."""
    for dtype in FLOAT_DTYPES:
        for tokens, hidden in TOKEN_SHAPES:
            g = seeded(seed, "silu_and_mul", dtype, tokens, hidden)
            args = {"x": randn(g, (tokens, 2 * hidden), dtype, 2.0)}
            yield Case("silu_and_mul", f"T={tokens} I={hidden}", args, row_independent=True)


CASES = {
    "rms_norm": rms_norm_cases,
    "fused_add_rms_norm": fused_add_rms_norm_cases,
    "rotary_embedding": rotary_embedding_cases,
    "silu_and_mul": silu_and_mul_cases,
}
