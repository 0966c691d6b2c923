"""Tolerance tables and rule helpers shared by the contract families."""

from __future__ import annotations

from typing import Any, Mapping

import torch

from ..spec import FP8_DTYPES, Rule, dtype_name

#: NMSE bounds (sum((out-ref)^2) / sum(ref^2), as llama.cpp's test-backend-ops) for ops
#: whose outputs are elementwise in their inputs: one rounding of the output dtype.
ELEMENTWISE = {torch.float32: 1e-9, torch.float16: 1e-5, torch.bfloat16: 1e-4}
#: For reductions over long axes (GEMMs, attention, expert sums): accumulation order
#: differs between backends, so the bounds are looser; fp8 paths pay for quantisation.
REDUCTION = {
    torch.float32: 1e-7,
    torch.float16: 1e-4,
    torch.bfloat16: 1e-3,
    torch.float8_e4m3fn: 5e-3,
}


def cache_matches_input(cache: str, source: str) -> Rule:
    """The cache holds the source's dtype, or fp8 (written with a scale)."""

    def check(call: Mapping[str, Any]) -> tuple[str, str, str] | None:
        got, want = call[cache].dtype, call[source].dtype
        if got == want or got in FP8_DTYPES:
            return None
        return cache, f"{dtype_name(want)} (like {source}) or fp8", dtype_name(got)

    return Rule(f"{cache} has {source}'s dtype or an fp8 dtype", check)


def divisible(arg: str, dim: int, by_arg: str, by_dim: int, what: str) -> Rule:
    """`arg.shape[dim]` is a multiple of `by_arg.shape[by_dim]` (GQA head counts)."""

    def check(call: Mapping[str, Any]) -> tuple[str, str, str] | None:
        n, d = call[arg].shape[dim], call[by_arg].shape[by_dim]
        if d > 0 and n % d == 0:
            return None
        return arg, f"{what} (dim {dim} a multiple of {by_arg}.shape[{by_dim}]={d})", str(n)

    return Rule(what, check)
