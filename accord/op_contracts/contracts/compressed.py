"""Contracts of compressed-KV attention (DeepSeek-V4's CSA and HCA layers) over the
paged cache: the KV compressor's state update, the Lightning Indexer's top-k, and the
attention over a sliding window plus compressed entries.

Layout shared by the three (see docs/deepseek_v4.md): every per-token state lives at
the token's own paged slot, so the block manager's tables address all of it. The
compressed entry of window w (positions w*R .. w*R+R-1) lives at the slot of the
window's last position (w+1)*R-1; query row t at position p may see entries
w < (p+1) // R, the windows that have closed by its position. Metadata (block_tables,
seq_lens, query_start_loc) means what it means for paged_attention.
"""

from __future__ import annotations

from typing import Any, Mapping

import torch

from ..spec import FLOAT_DTYPES, INDEX_DTYPES, OpContract, OutputSpec, ParamSpec, Rule, Switch, TensorSpec, UnorderedRows
from .attention import METADATA_GROUP, _metadata_tensors
from .common import REDUCTION


def _positive(*names: str) -> Rule:
    def check(call: Mapping[str, Any]) -> tuple[str, str, str] | None:
        for name in names:
            if call[name] < 1:
                return name, "a positive integer", str(call[name])
        return None

    return Rule(f"{', '.join(names)} positive", check)


KV_COMPRESS = OpContract(
    name="kv_compress",
    doc=(
        "The KV compressor's state update. state_cache holds each token's projected "
        "[kv | gate] at its paged slot (CD = C*D features each; C = 2 with overlap, else 1). "
        "Row n compresses window w = window_index[n] of sequence window_seq[n] (positions "
        "w*R .. w*R+R-1, all already written): slot j of the window contributes kv_j and "
        "logit gate_j + position_bias[j]; with overlap (CSA) window w contributes its "
        "second half (features D..2D) and, when w > 0, window w-1 contributes its first "
        "half (features 0..D) as R more slots. out[n, d] = sum_j softmax_j(logit[j, d]) * "
        "kv[j, d], in fp32, rounded once to the cache's dtype. Norm and rotary of the "
        "entry are the caller's (rms_norm, rotary_embedding)."
    ),
    tensors=(
        TensorSpec("state_cache", FLOAT_DTYPES, ("NB", "BS", "2*CD"), "per-token [kv | gate] projections"),
        TensorSpec("position_bias", (torch.float32,), ("R", "CD"), "learned bias per slot of a window (DeepSeek's ape)"),
        TensorSpec("block_tables", INDEX_DTYPES, ("B", "MB"), "physical block of each logical block", index=True),
        TensorSpec("window_seq", INDEX_DTYPES, ("N",), "sequence (block_tables row) of each window", index=True),
        TensorSpec("window_index", INDEX_DTYPES, ("N",), "window number w within its sequence", index=True),
    ),
    params=(ParamSpec("overlap", bool, False, choices=(True, False), doc="CSA's two-series overlapping windows"),),
    outputs=(OutputSpec("out", Switch("overlap", {True: ("N", "cdiv(CD,2)"), False: ("N", "CD")}), "like:state_cache"),),
    primary="state_cache",
    tolerance=REDUCTION,
)


INDEXER_TOPK = OpContract(
    name="indexer_topk",
    doc=(
        "The Lightning Indexer's selection. For query row t at position p of sequence b, "
        "score(t, w) = scale * sum_h weights[t, h] * relu(q[t, h] . K[w]) over the "
        "compressed indexer keys K (entry w at the slot of position (w+1)*R-1) with "
        "w < (p+1) // R, in fp32. ids[t] = the top_k entries by score, equal scores to "
        "the lower entry, padded with -1 when fewer entries are visible; id order within "
        "a row is not part of the contract (compared as sets)."
    ),
    tensors=(
        TensorSpec("q", FLOAT_DTYPES, ("T", "HI", "DI"), "rotated indexer queries"),
        TensorSpec("weights", (torch.float32,), ("T", "HI"), "per-head query weights"),
        TensorSpec("key_cache", FLOAT_DTYPES, ("NB", "BS", "DI"), "compressed indexer keys"),
        *_metadata_tensors(),
    ),
    params=(
        ParamSpec("top_k", int),
        ParamSpec("compress_rate", int),
        ParamSpec("scale", float, 1.0),
        ParamSpec("ids_dtype", torch.dtype, torch.int32, choices=INDEX_DTYPES, doc="width of ids"),
    ),
    outputs=(OutputSpec("ids", ("T", "top_k"), "param:ids_dtype", index=True),),
    primary="q",
    tolerance=REDUCTION,
    unordered_rows=UnorderedRows("ids"),
    dtype_groups=(("q", "key_cache"), METADATA_GROUP),
    rules=(_positive("top_k", "compress_rate"),),
)


def _compressed_inputs_consistent(call: Mapping[str, Any]) -> tuple[str, str, str] | None:
    if call["sliding_window"] < 1:
        return "sliding_window", "a positive window", str(call["sliding_window"])
    has_cache, rate = call["compressed_cache"] is not None, call["compress_rate"]
    if has_cache != (rate > 0):
        return "compressed_cache", "present exactly when compress_rate > 0", "present" if has_cache else "absent"
    if call["topk_ids"] is not None and not has_cache:
        return "topk_ids", "absent without a compressed cache", "a tensor"
    return None


COMPRESSED_ATTENTION = OpContract(
    name="compressed_attention",
    doc=(
        "DeepSeek-V4 attention, shared-KV MQA (one head of keys that are also the values). "
        "Query row t at position p of sequence b sees the cached positions p - W < s <= p "
        "of kv_cache and, when compress_rate R > 0, the compressed entries of "
        "compressed_cache: those in topk_ids[t] that are >= 0 (CSA), or every w < (p+1)//R "
        "(HCA, topk_ids absent). logits = scale * q[t, h] . k; a per-head sink logit "
        "sinks[h] joins the softmax and contributes no value; out[t, h] = sum probs * k. "
        "Softmax and sums in fp32, rounded once to q's dtype."
    ),
    tensors=(
        TensorSpec("q", FLOAT_DTYPES, ("T", "H", "D")),
        TensorSpec("kv_cache", FLOAT_DTYPES, ("NB", "BS", "D"), "the sliding branch's K=V"),
        TensorSpec("compressed_cache", FLOAT_DTYPES, ("NB", "BS", "D"), "compressed entries", optional=True),
        TensorSpec("sinks", (torch.float32,), ("H",), "attention sink logit per head", optional=True),
        TensorSpec("topk_ids", INDEX_DTYPES, ("T", "K"), "indexer's entries per row, -1 none", optional=True, index=True),
        *_metadata_tensors(),
    ),
    params=(
        ParamSpec("scale", float),
        ParamSpec("sliding_window", int),
        ParamSpec("compress_rate", int, 0, doc="0: sliding branch only"),
    ),
    outputs=(OutputSpec("out", ("T", "H", "D"), "like:q"),),
    primary="q",
    tolerance=REDUCTION,
    dtype_groups=(("q", "kv_cache", "compressed_cache"), METADATA_GROUP),
    rules=(Rule("window positive; compressed inputs match compress_rate", _compressed_inputs_consistent),),
)

CONTRACTS = (KV_COMPRESS, INDEXER_TOPK, COMPRESSED_ATTENTION)
