"""Cases for DeepSeek-V4's ops: the compressed-KV contracts (kv_compress, indexer_topk,
compressed_attention) over paged batches whose prompts end on and mid compression
block, and V4's calls of the MoE contracts at the real model's dtype mix.

The MoE ones extend moe.py's generators (this module's CASES chains them), so
moe_route also runs V4-Flash's hash layer as the engine calls it: int64 token ids from
the runner, the int32 tid2eid of the release (129280 x 6 over 256 experts), int32 or
int64 ids out; and fused_moe runs hash-routed ids with swiglu_limit through an expert
map where some tokens' experts all live on other ranks and some local experts get no
token."""

from __future__ import annotations

from itertools import chain
from typing import Iterator

import torch

from ...op_contracts import FLOAT_DTYPES, INDEX_DTYPES
from ..case import Case, distinct_rows, randint, randn, seeded, uniform
from . import moe
from .paged import BLOCK_SIZE, paged_batch

RATE = 4
HEADS, HEAD_DIM = 4, 32
INDEX_HEADS, INDEX_DIM = 4, 16
WINDOW = 6
#: (new query tokens, cached length incl. them): a lone first token (nothing closed), and
#: decodes on / past block and window edges, a prefill ending mid window, a chunk.
BATCHES = {
    "first-token": ((1, 1),),
    "mixed": ((1, BLOCK_SIZE), (1, BLOCK_SIZE + 1), (7, 7), (5, 2 * BLOCK_SIZE + 6)),
}


def _index_mixes() -> Iterator[tuple[torch.dtype, torch.dtype]]:
    """(metadata width, the other index tensors' width): equal and both mixes."""
    for metadata in INDEX_DTYPES:
        for other in INDEX_DTYPES:
            yield metadata, other


#: Compression rates whose windows span KV blocks (the block size is 16): 12 straddles
#: a block edge, V4's heavily compressed 128 spans eight blocks; with their batches.
SPANNING_RATES = {12: BATCHES["mixed"], 128: ((1, 2 * 128), (3, 2 * 128 + 44))}


def _windows(sequences: tuple[tuple[int, int], ...], rate: int = RATE) -> tuple[list[int], list[int]]:
    """Every closed window of each sequence (w = 0, where overlap has no predecessor,
    through the last one before a prompt's unfinished tail)."""
    seqs, windows = [], []
    for b, (_, seq_len) in enumerate(sequences):
        for w in range(seq_len // rate):
            seqs.append(b)
            windows.append(w)
    return seqs, windows


def _newly_closed(sequences: tuple[tuple[int, int], ...], rate: int) -> tuple[list[int], list[int]]:
    """A decode step's windows: the one window each sequence's new token closed."""
    return list(range(len(sequences))), [seq_len // rate - 1 for _, seq_len in sequences]


def _decode_batch(rate: int) -> tuple[tuple[int, int], ...]:
    """Four decodes that each close a window, the third its first (no predecessor)."""
    return tuple((1, windows * rate) for windows in (2, 3, 1, 5))


def _kv_compress_case(
    seed: int, dtype: torch.dtype, overlap: bool, rate: int, sequences: tuple[tuple[int, int], ...],
    windows: tuple[list[int], list[int]], index_dtypes: tuple[torch.dtype, torch.dtype], label: str,
) -> Case:
    g = seeded(seed, "kv_compress", dtype, overlap, rate, label, *index_dtypes)
    batch = paged_batch(g, sequences)
    width = (2 if overlap else 1) * HEAD_DIM
    seqs, indices = windows
    args = {
        "state_cache": randn(g, (batch.num_blocks, BLOCK_SIZE, 2 * width), dtype),
        "position_bias": randn(g, (rate, width), torch.float32, 0.5),
        "block_tables": batch.block_tables.to(index_dtypes[0]),
        "window_seq": torch.tensor(seqs).to(index_dtypes[1]),
        "window_index": torch.tensor(indices).to(index_dtypes[1]),
        "overlap": overlap,
    }
    return Case("kv_compress", f"{'csa' if overlap else 'hca'} {label} N={len(seqs)} R={rate}", args)


def kv_compress_cases(seed: int) -> Iterator[Case]:
    """state dtype x overlap (CSA) or not (HCA) x table / window-id widths over every
    closed window; then (int64 ids) windows that span blocks, and a decode step's
    batch of one newly closed window per sequence."""
    for dtype in FLOAT_DTYPES:
        for overlap in (True, False):
            for mix in _index_mixes():
                sequences = BATCHES["mixed"]
                yield _kv_compress_case(seed, dtype, overlap, RATE, sequences, _windows(sequences), mix, "all")
            wide = (torch.int64, torch.int64)
            for rate, sequences in SPANNING_RATES.items():
                yield _kv_compress_case(seed, dtype, overlap, rate, sequences, _windows(sequences, rate), wide,
                                        "spanning blocks")
            for rate in (RATE, 128):
                decodes = _decode_batch(rate)
                yield _kv_compress_case(seed, dtype, overlap, rate, decodes, _newly_closed(decodes, rate), wide,
                                        "decode closing one window each")


def indexer_topk_cases(seed: int) -> Iterator[Case]:
    """query dtype x metadata width x ids width x top_k below and above the visible count."""
    for dtype in FLOAT_DTYPES:
        for index_dtype, ids_dtype in _index_mixes():
            for name, sequences in BATCHES.items():
                for top_k in (2, 16):
                    g = seeded(seed, "indexer_topk", dtype, index_dtype, ids_dtype, name, top_k)
                    batch = paged_batch(g, sequences)
                    args = {
                        "q": randn(g, (batch.num_tokens, INDEX_HEADS, INDEX_DIM), dtype),
                        "weights": randn(g, (batch.num_tokens, INDEX_HEADS), torch.float32),
                        "key_cache": randn(g, (batch.num_blocks, BLOCK_SIZE, INDEX_DIM), dtype),
                        **batch.metadata(index_dtype),
                        "top_k": top_k,
                        "compress_rate": RATE,
                        "scale": INDEX_DIM**-0.5,
                        "ids_dtype": ids_dtype,
                    }
                    yield Case("indexer_topk", f"{name} top_k={top_k}", args)
        yield _tied_indexer_case(seed, dtype)


def _tied_indexer_case(seed: int, dtype: torch.dtype) -> Case:
    """Every compressed key equal, so each row's visible entries all tie and the
    contract's rule (equal scores to the lower entry) alone picks the top_k."""
    g = seeded(seed, "indexer_topk ties", dtype)
    sequences = BATCHES["mixed"]
    batch = paged_batch(g, sequences)
    key = randn(g, (INDEX_DIM,), dtype).abs()  # relu keeps some score for positive queries
    args = {
        "q": randn(g, (batch.num_tokens, INDEX_HEADS, INDEX_DIM), dtype),
        "weights": randn(g, (batch.num_tokens, INDEX_HEADS), torch.float32),
        "key_cache": key.expand(batch.num_blocks, BLOCK_SIZE, INDEX_DIM).contiguous(),
        **batch.metadata(torch.int64),
        "top_k": 2,
        "compress_rate": RATE,
        "scale": INDEX_DIM**-0.5,
        "ids_dtype": torch.int64,
    }
    return Case("indexer_topk", "mixed tied scores top_k=2", args)


def _topk_ids(
    generator: torch.Generator, batch_sequences: tuple[tuple[int, int], ...], k: int, partial: bool = False
) -> torch.Tensor:
    """Distinct visible entries per query row, -1 past what the row can see; with
    `partial`, one pick fewer than the row could make and never entry 0, so the -1
    pads sit beside unpicked entries (a kernel reading -1 as entry 0 shows)."""
    rows = []
    for q_len, seq_len in batch_sequences:
        for position in range(seq_len - q_len, seq_len):
            visible = (position + 1) // RATE
            candidates = torch.randperm(max(visible, 1), generator=generator)
            if partial:
                candidates = candidates[candidates > 0]
            picks = candidates[: max(min(k, visible) - partial, 0)]
            rows.append(torch.cat([picks, torch.full((k - picks.numel(),), -1)]))
    return torch.stack(rows)


def compressed_attention_cases(seed: int) -> Iterator[Case]:
    """dtype x metadata / topk widths x sliding-only, HCA (every closed window) and CSA
    (the indexer's picks, also fewer than visible, -1 padded), with and without sinks."""
    variants = (("sliding", 0, False), ("hca", RATE, False), ("csa", RATE, True), ("csa partial picks", RATE, True))
    for dtype in FLOAT_DTYPES:
        for index_dtype, ids_dtype in _index_mixes():
            for name, sequences in BATCHES.items():
                for variant, rate, sparse in variants:
                    for sinks in (True, False):
                        g = seeded(seed, "compressed_attention", dtype, index_dtype, ids_dtype, name, variant, sinks)
                        batch = paged_batch(g, sequences)
                        cache_shape = (batch.num_blocks, BLOCK_SIZE, HEAD_DIM)
                        args = {
                            "q": randn(g, (batch.num_tokens, HEADS, HEAD_DIM), dtype),
                            "kv_cache": randn(g, cache_shape, dtype),
                            "compressed_cache": randn(g, cache_shape, dtype) if rate else None,
                            "sinks": randn(g, (HEADS,), torch.float32) if sinks else None,
                            "topk_ids": _topk_ids(g, sequences, 3, "partial" in variant).to(ids_dtype)
                            if sparse else None,
                            **batch.metadata(index_dtype),
                            "scale": HEAD_DIM**-0.5,
                            "sliding_window": WINDOW,
                            "compress_rate": rate,
                        }
                        label = f"{name} {variant}{' sinks' if sinks else ''}"
                        yield Case("compressed_attention", label, args)


#: DeepSeek-V4-Flash's hash layers: vocabulary, routed experts, experts per token.
V4_VOCAB, V4_EXPERTS, V4_TOP_K = 129280, 256, 6


def v4_hash_route_cases(seed: int) -> Iterator[Case]:
    """The engine's call on a V4 hash layer: int64 token ids, int32 tid2eid, either id width out."""
    for ids_dtype in INDEX_DTYPES:
        g = seeded(seed, "moe_route v4 hash", ids_dtype)
        tokens = 5
        table = torch.stack([torch.randperm(V4_EXPERTS, generator=g)[:V4_TOP_K] for _ in range(64)])
        # Rows past the first 64 repeat them (the lookup is what is tested, not 129280 draws).
        args = {
            "router_logits": randn(g, (tokens, V4_EXPERTS), torch.float32),
            "token_ids": torch.cat([randint(g, 64, (tokens - 1,), torch.int64), torch.tensor([V4_VOCAB - 1])]),
            "hash_table": table.repeat(-(-V4_VOCAB // 64), 1)[:V4_VOCAB].to(torch.int32).contiguous(),
            "top_k": V4_TOP_K,
            "scoring": "sqrt_softplus",
            "selection": "hash",
            "renormalize": True,
            "routed_scaling_factor": 1.5,
            "ids_dtype": ids_dtype,
        }
        yield Case("moe_route", f"v4 hash T={tokens} V={V4_VOCAB} E={V4_EXPERTS}", args, row_independent=True)


def v4_fused_moe_cases(seed: int) -> Iterator[Case]:
    """Hash-routed int32 ids with swiglu_limit, on float and fp8 block-scaled weights,
    through an expert map (either width) that puts every expert of token 0 on another
    rank and leaves a local expert idle, or with local ids and no map."""
    experts, local, tokens, top_k = 8, 4, 6, 2
    for dtype in FLOAT_DTYPES:
        for weight_dtype in (dtype, torch.float8_e4m3fn):
            for map_dtype in (None, *INDEX_DTYPES):
                g = seeded(seed, "fused_moe v4", dtype, weight_dtype, map_dtype)
                w13 = moe.expert_weights(g, (local, 2 * moe.INTERMEDIATE, moe.HIDDEN), weight_dtype, 0.3)
                w2 = moe.expert_weights(g, (local, moe.HIDDEN, moe.INTERMEDIATE), weight_dtype, 0.1)
                routing: dict[str, torch.Tensor] = {}
                if map_dtype is None:
                    ids = distinct_rows(g, 16, local, top_k).to(torch.int32)[randint(g, 16, (tokens,), torch.int64)]
                else:
                    # The hash table never names the last expert: owned here, it stays idle.
                    table = distinct_rows(g, 16, experts - 1, top_k).to(torch.int32)
                    ids = table[randint(g, 16, (tokens,), torch.int64)]
                    others = [e for e in range(experts - 1) if e not in ids[0].tolist()]
                    owned = torch.tensor([experts - 1, *others[: local - 1]])
                    expert_map = torch.full((experts,), -1, dtype=torch.int64)
                    expert_map[owned] = torch.arange(local)
                    routing["expert_map"] = expert_map.to(map_dtype)
                args = {
                    "hidden": randn(g, (tokens, moe.HIDDEN), dtype),
                    "w13": w13["weight"],
                    "w2": w2["weight"],
                    "topk_weights": uniform(g, (tokens, top_k), 0.1, 1.0),
                    "topk_ids": ids.contiguous(),
                    **routing,
                    "w13_scale": w13.get("scale"),
                    "w2_scale": w2.get("scale"),
                    "swiglu_limit": 1.0,
                }
                placement = "local ids" if map_dtype is None else "expert map"
                yield Case("fused_moe", f"v4 hash ids swiglu_limit T={tokens} {placement}", args, row_independent=True)


CASES = {
    "kv_compress": kv_compress_cases,
    "indexer_topk": indexer_topk_cases,
    "compressed_attention": compressed_attention_cases,
    "moe_route": lambda seed: chain(moe.moe_route_cases(seed), v4_hash_route_cases(seed)),
    "fused_moe": lambda seed: chain(moe.fused_moe_cases(seed), v4_fused_moe_cases(seed)),
}
