"""Cases for moe_route (softmax, grouped sigmoid with bias, sqrt-softplus, hash) and
fused_moe (float and fp8 block-scaled weights, experts that get no token, -1 ids under
an expert map), over every mix of int32 and int64 index tensors."""

from __future__ import annotations

from typing import Any, Iterator

import torch

from ...op_contracts import FLOAT_DTYPES, FP8_DTYPES, INDEX_DTYPES
from ..case import Case, distinct_rows, randint, randn, seeded, uniform

EXPERTS = 16
TOKEN_COUNTS = (1, 9)
#: Top-k routing variants (name, parameters), the ones DeepSeek, Qwen and Mixtral use.
TOPK_ROUTES: dict[str, dict[str, Any]] = {
    "softmax top2": {"top_k": 2, "scoring": "softmax"},
    "sigmoid grouped+bias": {
        "top_k": 4,
        "scoring": "sigmoid",
        "renormalize": True,
        "n_group": 4,
        "topk_group": 2,
        "routed_scaling_factor": 2.5,
    },
    "sqrt_softplus top3": {"top_k": 3, "scoring": "sqrt_softplus", "renormalize": True},
}
HASH_VOCAB, HASH_TOP_K = 32, 2
#: routed_scaling_factor other than 1 (DeepSeek-V3's 2.5), with and without renormalising.
SCALING = 2.5
#: The scorings a correction bias is paired with: DeepSeek-V3's sigmoid, V4's sqrt-softplus.
BIASED_SCORING = ("sigmoid", "sqrt_softplus")
#: The step of the wide logits ladder: 16 experts span -120..105, past where exp
#: overflows fp16 (11) and fp32 (88), and every step is exact in every float dtype.
WIDE_STEP = 15.0


def _flag_combinations() -> dict[str, dict[str, Any]]:
    """Every scoring function x renormalise x routed scaling (1 and not) x grouped
    selection (for sigmoid and sqrt-softplus, with and without a correction bias): each flag on its own,
    so a kernel that gets one combination wrong cannot hide behind a bundled variant."""
    combos = {}
    for scoring in ("softmax", "sigmoid", "sqrt_softplus"):
        for renormalize in (False, True):
            for scaling in (1.0, SCALING):
                for grouped in (False, True):
                    for bias in ((False, True) if scoring in BIASED_SCORING else (False,)):
                        name = (f"{scoring} renorm={renormalize} scale={scaling:g}"
                                + (" grouped" if grouped else "") + (" +bias" if bias else ""))
                        combos[name] = {
                            "top_k": 4, "scoring": scoring, "renormalize": renormalize,
                            "routed_scaling_factor": scaling, "n_group": 4 if grouped else 1,
                            "topk_group": 2 if grouped else 1, "bias": bias,
                        }
    return combos


FLAG_COMBINATIONS = _flag_combinations()


def _router_logits(generator: torch.Generator, tokens: int, dtype: torch.dtype, step: float = 0.25) -> torch.Tensor:
    """Logits that are distinct within each row and exact in every float dtype (a
    shuffled ladder of `step`s), so the top-k has no ties to break."""
    ladder = (torch.arange(EXPERTS) - EXPERTS / 2) * step
    return torch.stack([ladder[torch.randperm(EXPERTS, generator=generator)] for _ in range(tokens)]).to(dtype)


def _topk_route_cases(seed: int) -> Iterator[Case]:
    for dtype in FLOAT_DTYPES:
        for ids_dtype in INDEX_DTYPES:
            for name, params in TOPK_ROUTES.items():
                for tokens in TOKEN_COUNTS:
                    g = seeded(seed, "moe_route", dtype, ids_dtype, name, tokens)
                    args = {"router_logits": _router_logits(g, tokens, dtype), **params, "ids_dtype": ids_dtype}
                    if params["scoring"] == "sigmoid":
                        args["correction_bias"] = randn(g, (EXPERTS,), torch.float32, 0.1)
                    yield Case("moe_route", f"{name} T={tokens} E={EXPERTS}", args, row_independent=True)


def _flag_combination_cases(seed: int) -> Iterator[Case]:
    """Each flag combination at each logits dtype (int64 ids: widths are covered above)."""
    for dtype in FLOAT_DTYPES:
        for name, flags in FLAG_COMBINATIONS.items():
            g = seeded(seed, "moe_route flags", dtype, name)
            params = {k: v for k, v in flags.items() if k != "bias"}
            args = {"router_logits": _router_logits(g, 9, dtype), **params, "ids_dtype": torch.int64}
            if flags["bias"]:
                args["correction_bias"] = randn(g, (EXPERTS,), torch.float32, 0.1)
            yield Case("moe_route", f"{name} T=9", args, row_independent=True)


def _wide_logits_cases(seed: int) -> Iterator[Case]:
    """Logits far past exp's range in every float dtype, for the scorings that
    exponentiate: a kernel must subtract the row's max (softmax) or take softplus's
    linear branch, or its weights turn to Inf and NaN. (Sigmoid saturates to ties here.)"""
    for dtype in FLOAT_DTYPES:
        for scoring in ("softmax", "sqrt_softplus"):
            g = seeded(seed, "moe_route wide", dtype, scoring)
            args = {
                "router_logits": _router_logits(g, 9, dtype, WIDE_STEP), "top_k": 4, "scoring": scoring,
                "renormalize": True, "ids_dtype": torch.int64,
            }
            yield Case("moe_route", f"{scoring} wide logits +-{8 * WIDE_STEP:g} T=9", args, row_independent=True)


def _hash_route_cases(seed: int) -> Iterator[Case]:
    for token_dtype in INDEX_DTYPES:
        for table_dtype in INDEX_DTYPES:
            for ids_dtype in INDEX_DTYPES:
                for tokens in TOKEN_COUNTS:
                    g = seeded(seed, "moe_route hash", token_dtype, table_dtype, ids_dtype, tokens)
                    args = {
                        "router_logits": _router_logits(g, tokens, torch.bfloat16),
                        "token_ids": randint(g, HASH_VOCAB, (tokens,), token_dtype),
                        "hash_table": distinct_rows(g, HASH_VOCAB, EXPERTS, HASH_TOP_K).to(table_dtype),
                        "top_k": HASH_TOP_K,
                        "scoring": "sqrt_softplus",
                        "selection": "hash",
                        "renormalize": True,
                        "ids_dtype": ids_dtype,
                    }
                    yield Case("moe_route", f"hash T={tokens} V={HASH_VOCAB}", args, row_independent=True)


def moe_route_cases(seed: int) -> Iterator[Case]:
    """Top-k variants at each logits dtype and id width; hash routing over every mix
    of token-id, table and output id widths (the motivating crash's territory)."""
    yield from _topk_route_cases(seed)
    yield from _flag_combination_cases(seed)
    yield from _wide_logits_cases(seed)
    yield from _hash_route_cases(seed)


#: Local experts, and the global expert count when an expert map spreads them (EP).
LOCAL_EXPERTS, GLOBAL_EXPERTS = 4, 8
#: Hidden and intermediate sizes past one 128 block, so block scales have partial tiles.
HIDDEN, INTERMEDIATE = 160, 80
MOE_TOP_K = 2
#: fused_moe's fp8 weights carry one scale per 128x128 tile (the contract's shapes).
WEIGHT_BLOCK = 128


def expert_weights(
    generator: torch.Generator, shape: tuple[int, int, int], dtype: torch.dtype, scale: float = 0.05
) -> dict[str, torch.Tensor]:
    """A stacked expert weight at `dtype` (values times `scale`); fp8 weights come with
    128x128 block scales instead."""
    if dtype not in FP8_DTYPES:
        return {"weight": randn(generator, shape, dtype, scale)}
    experts, rows, cols = shape
    blocks = (experts, -(-rows // WEIGHT_BLOCK), -(-cols // WEIGHT_BLOCK))
    return {"weight": randn(generator, shape, dtype), "scale": uniform(generator, blocks, 0.02, 0.06)}


def _routing(generator: torch.Generator, tokens: int, expert_map_dtype: torch.dtype | None) -> dict[str, Any]:
    """topk ids that leave some expert without a token: without a map, ids avoid the
    last local expert; with one, half the global experts map to -1 (other ranks)."""
    if expert_map_dtype is None:
        return {"topk_ids": distinct_rows(generator, tokens, LOCAL_EXPERTS - 1, MOE_TOP_K)}
    expert_map = torch.full((GLOBAL_EXPERTS,), -1, dtype=torch.int64)
    owned = torch.randperm(GLOBAL_EXPERTS, generator=generator)[:LOCAL_EXPERTS]
    expert_map[owned] = torch.arange(LOCAL_EXPERTS)
    return {
        "topk_ids": distinct_rows(generator, tokens, GLOBAL_EXPERTS, MOE_TOP_K),
        "expert_map": expert_map.to(expert_map_dtype),
    }


def fused_moe_cases(seed: int) -> Iterator[Case]:
    """hidden dtype x weight dtype (same or either fp8) x topk_ids width x expert map
    (none, int32, int64)."""
    for dtype in FLOAT_DTYPES:
        for weight_dtype in (dtype, *FP8_DTYPES):
            for ids_dtype in INDEX_DTYPES:
                for map_dtype in (None, *INDEX_DTYPES):
                    for tokens in (1, 6):
                        g = seeded(seed, "fused_moe", dtype, weight_dtype, ids_dtype, map_dtype, tokens)
                        w13 = expert_weights(g, (LOCAL_EXPERTS, 2 * INTERMEDIATE, HIDDEN), weight_dtype)
                        w2 = expert_weights(g, (LOCAL_EXPERTS, HIDDEN, INTERMEDIATE), weight_dtype)
                        routing = _routing(g, tokens, map_dtype)
                        args = {
                            "hidden": randn(g, (tokens, HIDDEN), dtype),
                            "w13": w13["weight"],
                            "w2": w2["weight"],
                            "topk_weights": uniform(g, (tokens, MOE_TOP_K), 0.1, 1.0),
                            **routing,
                            "topk_ids": routing["topk_ids"].to(ids_dtype),
                            "w13_scale": w13.get("scale"),
                            "w2_scale": w2.get("scale"),
                        }
                        placement = "local ids" if map_dtype is None else "expert map"
                        yield Case("fused_moe", f"T={tokens} E={LOCAL_EXPERTS} {placement}", args, row_independent=True)


CASES = {"moe_route": moe_route_cases, "fused_moe": fused_moe_cases}
