"""Cases for quantize_fp8 (per tensor, static per tensor, per token, per 128 group) and
scaled_mm (tensor, row and block scales), in both fp8 flavours."""

from __future__ import annotations

from typing import Any, Iterator

import torch

from ...op_contracts import FLOAT_DTYPES, FP8_DTYPES
from ...op_contracts.contracts.fp8 import GROUP
from ..case import Case, randn, seeded, uniform

#: (tokens, hidden): one token, and a width with a partial last 128 group.
QUANT_SHAPES = ((1, 64), (5, 200))
STATIC_SCALE = 0.02
#: (name, mode, static scale given); per-tensor scales couple all rows together.
QUANT_MODES = (
    ("per_tensor", "per_tensor", False),
    ("per_tensor static", "per_tensor", True),
    ("per_token", "per_token", False),
    ("per_group", "per_group", False),
)


def quantize_fp8_cases(seed: int) -> Iterator[Case]:
    """x dtype x granularity x fp8 flavour."""
    for dtype in FLOAT_DTYPES:
        for fp8_dtype in FP8_DTYPES:
            for name, mode, static in QUANT_MODES:
                for tokens, hidden in QUANT_SHAPES:
                    g = seeded(seed, "quantize_fp8", dtype, fp8_dtype, name, tokens)
                    args: dict[str, Any] = {
                        "x": randn(g, (tokens, hidden), dtype, 3.0),
                        "scale": torch.full((1, 1), STATIC_SCALE) if static else None,
                        "mode": mode,
                        "group_size": GROUP,
                        "fp8_dtype": fp8_dtype,
                    }
                    independent = mode != "per_tensor" or static
                    yield Case("quantize_fp8", f"{name} T={tokens} H={hidden}", args, row_independent=independent)
                g = seeded(seed, "quantize_fp8 zeros", dtype, fp8_dtype, name)
                yield Case("quantize_fp8", f"{name} zero rows and groups", {
                    "x": _with_zeros(randn(g, (4, 2 * GROUP), dtype, 3.0)),
                    "scale": torch.full((1, 1), STATIC_SCALE) if static else None,
                    "mode": mode, "group_size": GROUP, "fp8_dtype": fp8_dtype,
                }, row_independent=mode != "per_tensor" or static)


def _with_zeros(x: torch.Tensor) -> torch.Tensor:
    """Padding tokens: row 1 all zero, and row 3's second 128 group zero (the scale's
    amax floor keeps them finite)."""
    x[1] = 0
    x[3, GROUP:] = 0
    return x


#: (rows, output columns, inner): N past one 128 block, and K both a whole number of
#: 128 groups and not (a partial last K group), so block scales are partial.
MM_SHAPES = ((1, 160, 256), (5, 160, 256), (5, 160, 200))


def _scales(
    generator: torch.Generator, mode: str, rows: int, cols: int, inner: int
) -> tuple[torch.Tensor, torch.Tensor]:
    """(a_scale, b_scale) for `mode`, positive fp32, shaped as the contract says."""
    blocks = -(-inner // GROUP)
    shapes = {
        "tensor": ((1, 1), (1, 1)),
        "row": ((rows, 1), (cols, 1)),
        "block": ((rows, blocks), (-(-cols // GROUP), blocks)),
    }[mode]
    return uniform(generator, shapes[0], 0.01, 0.03), uniform(generator, shapes[1], 0.01, 0.03)


def scaled_mm_cases(seed: int) -> Iterator[Case]:
    """fp8 flavour x scale granularity x output dtype x bias (absent or any float
    dtype: the contract lets a bias differ from the output)."""
    for fp8_dtype in FP8_DTYPES:
        for mode in ("tensor", "row", "block"):
            for out_dtype in FLOAT_DTYPES:
                for bias_dtype in (None, *FLOAT_DTYPES):
                    for rows, cols, inner in MM_SHAPES:
                        g = seeded(seed, "scaled_mm", fp8_dtype, mode, out_dtype, bias_dtype, rows, inner)
                        a_scale, b_scale = _scales(g, mode, rows, cols, inner)
                        args = {
                            "a": randn(g, (rows, inner), fp8_dtype, 4.0),
                            "b": randn(g, (cols, inner), fp8_dtype, 4.0),
                            "a_scale": a_scale,
                            "b_scale": b_scale,
                            "bias": None if bias_dtype is None else randn(g, (cols,), bias_dtype),
                            "scale_mode": mode,
                            "out_dtype": out_dtype,
                        }
                        name = f"{mode} M={rows} N={cols} K={inner}" + ("" if bias_dtype is None else " +bias")
                        yield Case("scaled_mm", name, args, row_independent=True)


CASES = {"quantize_fp8": quantize_fp8_cases, "scaled_mm": scaled_mm_cases}
