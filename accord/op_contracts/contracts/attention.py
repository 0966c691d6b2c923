"""Contracts of the KV cache writers and the paged attention ops (GQA and MLA).

Attention metadata is one varlen batch: sequence b owns query rows
`query_start_loc[b]:query_start_loc[b+1]` (its new tokens, a prefill chunk or one
decode token) and `seq_lens[b]` cached tokens counting those new ones, which the
cache writers have already stored. Query row i of b sits at absolute position
`seq_lens[b] - q_len_b + i` and attends causally to every cached position <= its own.
Cache position p of sequence b lives in block `block_tables[b, p // BS]`, slot
`p % BS`. Query rows past `query_start_loc[B]` are padding: their output is unspecified.
The three metadata tensors form one dtype group: a kernel reads them all at
one index width, so a call that mixes widths is refused at the boundary.
"""

from __future__ import annotations

from typing import Any, Mapping

import torch

from ..spec import FLOAT_DTYPES, FP8_DTYPES, INDEX_DTYPES, OpContract, OutputSpec, ParamSpec, Rule, TensorSpec
from .common import ELEMENTWISE, REDUCTION, STORED_EXACTLY, cache_matches_input, divisible

CACHE_DTYPES = FLOAT_DTYPES + FP8_DTYPES
METADATA_GROUP = ("block_tables", "seq_lens", "query_start_loc")


def _metadata_tensors() -> tuple[TensorSpec, ...]:
    return (
        TensorSpec("block_tables", INDEX_DTYPES, ("B", "MB"), "physical block of each logical block", index=True),
        TensorSpec("seq_lens", INDEX_DTYPES, ("B",), "cached tokens per sequence, new ones included", index=True),
        TensorSpec("query_start_loc", INDEX_DTYPES, ("B+1",), "prefix sum of query lengths", index=True),
    )


RESHAPE_AND_CACHE = OpContract(
    name="reshape_and_cache",
    doc=(
        "For each token t with slot s = slot_mapping[t] >= 0: key_cache[s // BS, s % BS] "
        "= key[t] and value_cache likewise; a negative slot is padding and is skipped. "
        "An fp8 cache stores key / k_scale and value / v_scale, saturated to the fp8 range."
    ),
    tensors=(
        TensorSpec("key", FLOAT_DTYPES, ("T", "Hk", "D")),
        TensorSpec("value", FLOAT_DTYPES, ("T", "Hk", "D")),
        TensorSpec("key_cache", CACHE_DTYPES, ("NB", "BS", "Hk", "D"), mutated=True),
        TensorSpec("value_cache", CACHE_DTYPES, ("NB", "BS", "Hk", "D"), mutated=True),
        TensorSpec("slot_mapping", INDEX_DTYPES, ("T",), "flat cache slot per token, -1 skips", index=True),
    ),
    params=(ParamSpec("k_scale", float, 1.0), ParamSpec("v_scale", float, 1.0)),
    outputs=(),
    primary="key",
    tolerance=ELEMENTWISE | {torch.float8_e4m3fn: 0.0},
    ulps=STORED_EXACTLY,
    dtype_groups=(("key", "value"), ("key_cache", "value_cache")),
    rules=(cache_matches_input("key_cache", "key"),),
)

CONCAT_AND_CACHE_MLA = OpContract(
    name="concat_and_cache_mla",
    doc=(
        "MLA's latent cache writer: for each token t with slot s >= 0, "
        "kv_cache[s // BS, s % BS] = concat(kv_c[t], k_pe[t]) (divided by scale into "
        "an fp8 cache); a negative slot is skipped."
    ),
    tensors=(
        TensorSpec("kv_c", FLOAT_DTYPES, ("T", "L"), "compressed latent KV (normed)"),
        TensorSpec("k_pe", FLOAT_DTYPES, ("T", "R"), "rotated decoupled rope key"),
        TensorSpec("kv_cache", CACHE_DTYPES, ("NB", "BS", "L+R"), mutated=True),
        TensorSpec("slot_mapping", INDEX_DTYPES, ("T",), index=True),
    ),
    params=(ParamSpec("scale", float, 1.0),),
    outputs=(),
    primary="kv_c",
    tolerance=ELEMENTWISE | {torch.float8_e4m3fn: 0.0},
    ulps=STORED_EXACTLY,
    dtype_groups=(("kv_c", "k_pe"),),
    rules=(cache_matches_input("kv_cache", "kv_c"),),
)


def _window_non_negative(call: Mapping[str, Any]) -> tuple[str, str, str] | None:
    window = call["sliding_window"]
    return None if window >= 0 else ("sliding_window", "0 (off) or a positive window", str(window))


PAGED_ATTENTION = OpContract(
    name="paged_attention",
    doc=(
        "Varlen causal attention over the paged cache, one call for prefill chunks and "
        "decodes alike: out[t, h] = softmax(scale * q[t, h] . K_b^T) V_b over the cached "
        "positions row t may see, with kv head h // (Hq / Hk) (GQA). With "
        "sliding_window w > 0, row at position q sees positions p with q - p < w. An fp8 "
        "cache is read as stored * k_scale (v_scale). Softmax in fp32."
    ),
    tensors=(
        TensorSpec("query", FLOAT_DTYPES, ("T", "Hq", "D")),
        TensorSpec("key_cache", CACHE_DTYPES, ("NB", "BS", "Hk", "D")),
        TensorSpec("value_cache", CACHE_DTYPES, ("NB", "BS", "Hk", "D")),
        *_metadata_tensors(),
    ),
    params=(
        ParamSpec("scale", float, doc="softmax scale, usually D ** -0.5"),
        ParamSpec("sliding_window", int, 0, doc="0: full causal"),
        ParamSpec("k_scale", float, 1.0),
        ParamSpec("v_scale", float, 1.0),
    ),
    outputs=(OutputSpec("out", ("T", "Hq", "D"), "like:query"),),
    primary="query",
    tolerance=REDUCTION,
    dtype_groups=(("key_cache", "value_cache"), METADATA_GROUP),
    rules=(
        cache_matches_input("key_cache", "query"),
        divisible("query", 1, "key_cache", 2, "query heads are a multiple of kv heads"),
        Rule("sliding_window >= 0", _window_non_negative),
    ),
)

MLA_ATTENTION = OpContract(
    name="mla_attention",
    doc=(
        "Multi-head latent attention over the latent cache with absorbed weights: "
        "score(t, h, p) = scale * (q_latent[t, h] . c[p, :L] + q_pe[t, h] . c[p, L:]) "
        "where c is the cached concat(kv_c, k_pe) (times kv_scale when fp8); out[t, h] = "
        "softmax_p(score) . c[p, :L]. Causality and metadata as paged_attention. The "
        "caller absorbs W_UK into q_latent and applies W_UV to the output."
    ),
    tensors=(
        TensorSpec("q_latent", FLOAT_DTYPES, ("T", "H", "L"), "q_nope @ W_UK per head"),
        TensorSpec("q_pe", FLOAT_DTYPES, ("T", "H", "R"), "rotated rope part of q"),
        TensorSpec("kv_cache", CACHE_DTYPES, ("NB", "BS", "L+R")),
        *_metadata_tensors(),
    ),
    params=(ParamSpec("scale", float), ParamSpec("kv_scale", float, 1.0)),
    outputs=(OutputSpec("out", ("T", "H", "L"), "like:q_latent"),),
    primary="q_latent",
    tolerance=REDUCTION,
    dtype_groups=(("q_latent", "q_pe"), METADATA_GROUP),
    rules=(cache_matches_input("kv_cache", "q_latent"),),
)

CONTRACTS = (RESHAPE_AND_CACHE, CONCAT_AND_CACHE_MLA, PAGED_ATTENTION, MLA_ATTENTION)
