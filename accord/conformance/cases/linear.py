"""Cases for the dense GEMM: one row (decode), odd row counts, K and N that are not
tile multiples, with and without bias, at every float dtype."""

from __future__ import annotations

from typing import Iterator

from ...op_contracts import FLOAT_DTYPES
from ..case import Case, randn, seeded

#: (rows T, input features K, output features N).
LINEAR_SHAPES = ((1, 64, 48), (7, 96, 80), (33, 40, 136))


def linear_cases(seed: int) -> Iterator[Case]:
    """x, weight (and bias) at each float dtype; weights scaled like a 1/sqrt(K) init."""
    for dtype in FLOAT_DTYPES:
        for tokens, depth, width in LINEAR_SHAPES:
            for with_bias in (False, True):
                g = seeded(seed, "linear", dtype, tokens, depth, width, with_bias)
                args = {
                    "x": randn(g, (tokens, depth), dtype),
                    "weight": randn(g, (width, depth), dtype, depth**-0.5),
                    "bias": randn(g, (width,), dtype) if with_bias else None,
                }
                name = f"T={tokens} K={depth} N={width}" + (" bias" if with_bias else "")
                yield Case("linear", name, args, row_independent=True)


CASES = {"linear": linear_cases}
