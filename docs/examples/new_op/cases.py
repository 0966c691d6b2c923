"""The worked example of docs/plugin_authoring.md, file 3 of 3: its conformance cases,
seeded. In the tree they join accord/conformance/cases/elementwise.py (its CASES
dict); the illegal calls are derived from them."""

from __future__ import annotations

from typing import Iterator

from accord.conformance.case import Case, randn, seeded
from accord.op_contracts import FLOAT_DTYPES

#: (tokens, I): one token (a decode), an odd count and a width not a power of two.
SHAPES = ((1, 64), (7, 96))


def gelu_and_mul_cases(seed: int) -> Iterator[Case]:
    """x at each float dtype and shape; each row depends on itself only."""
    for dtype in FLOAT_DTYPES:
        for tokens, width in SHAPES:
            g = seeded(seed, "gelu_and_mul", dtype, tokens, width)
            args = {"x": randn(g, (tokens, 2 * width), dtype, 2.0)}
            yield Case("gelu_and_mul", f"T={tokens} I={width}", args, row_independent=True)


CASES = {"gelu_and_mul": gelu_and_mul_cases}
