"""Cases for the dense GEMM: one row (decode), odd row counts, K and N that are not
tile multiples, with and without bias, at every float dtype; each on the plain weight
and on the backend's load-time form of it (`prepare_linear_weight`: a prepacked layout,
or a bf16 copy for few rows), and fp32 weights whose values are exactly bf16 (a bf16
checkpoint computed in fp32, which a backend may stream as bf16). Half operands also run
with an fp32 output (`out_dtype`, as the LM head asks for its logits), on every weight
form and at every row count, since a backend may take another path for it."""

from __future__ import annotations

from typing import Iterator

import torch

from ...op_contracts import FLOAT_DTYPES
from ..case import Case, randn, seeded

#: (rows T, input features K, output features N): 1, 3 and 4 rows are decode row counts
#: (a backend may take a few-rows path there: the cpu backend's takes up to 4), 7 and 33
#: take its many-rows path. A square weight (N == K), so a kernel that guesses the
#: weight's orientation from its shape is caught; K = 200 (a remainder past one full
#: 128 block); K = 2880 (gpt-oss's hidden size), long enough that a half-precision
#: running sum drifts past the bound, at both row paths.
LINEAR_SHAPES = (
    (1, 64, 48), (3, 72, 42), (4, 40, 30), (7, 96, 80), (33, 40, 136),
    (5, 64, 64), (6, 200, 72), (3, 2880, 40), (9, 2880, 24),
)

#: The weight forms: name suffix, whether the backend prepares it, whether its values
#: are rounded to bf16 first (fp32 only: at bf16 and fp16 that changes nothing new).
WEIGHT_FORMS = (("", False, False), (" prepared", True, False), (" bf16-valued prepared", True, True))


#: The output widths: x's dtype (out_dtype None) at every dtype, fp32 from half operands.
OUT_DTYPES = {
    torch.float32: (None,),
    torch.float16: (None, torch.float32),
    torch.bfloat16: (None, torch.float32),
}


def linear_cases(seed: int) -> Iterator[Case]:
    """x, weight (and bias) at each float dtype, output width and weight form; weights
    scaled like a 1/sqrt(K) init."""
    for dtype in FLOAT_DTYPES:
        for tokens, depth, width in LINEAR_SHAPES:
            for with_bias in (False, True):
                for out_dtype in OUT_DTYPES[dtype]:
                    for suffix, prepared, bf16_valued in WEIGHT_FORMS:
                        if bf16_valued and dtype != torch.float32:
                            continue
                        g = seeded(seed, "linear", dtype, tokens, depth, width, with_bias)
                        x = randn(g, (tokens, depth), dtype)
                        weight = randn(g, (width, depth), torch.bfloat16 if bf16_valued else dtype, depth**-0.5)
                        args = {
                            "x": x,
                            "weight": weight.to(dtype),
                            "bias": randn(g, (width,), dtype) if with_bias else None,
                            "out_dtype": out_dtype,
                        }
                        name = f"T={tokens} K={depth} N={width}" + (" bias" if with_bias else "") + suffix
                        prepare = ("weight",) if prepared else ()
                        yield Case("linear", name, args, row_independent=True, prepared=prepare)


CASES = {"linear": linear_cases}
