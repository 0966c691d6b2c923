"""Cases for paged_attention (GQA) and mla_attention: a lone first token, and a mixed
batch of decodes on and just past a block edge, a prefill and a chunk with context,
and a decode over thousands of positions."""

from __future__ import annotations

from typing import Iterator

import torch

from ...op_contracts import FLOAT_DTYPES, FP8_DTYPES, INDEX_DTYPES
from ..case import Case, randn, seeded
from .paged import BLOCK_SIZE, paged_batch

#: A decode context of more than two partitions of 1024 positions, ending off a block edge.
SPLIT_CONTEXT = 2 * 1024 + 7 * BLOCK_SIZE + 5
#: Named batches of (new query tokens, cached length incl. those tokens) per sequence.
BATCHES = {
    "first-token": ((1, 1),),
    "mixed": ((1, BLOCK_SIZE), (1, BLOCK_SIZE + 1), (5, 5), (3, 2 * BLOCK_SIZE + 4)),
    # A whole prefill and a chunk whose cached length ends exactly on a block edge.
    "prefill on block edge": ((BLOCK_SIZE, BLOCK_SIZE), (5, 2 * BLOCK_SIZE), (1, 3)),
    # Decodes over many blocks at unequal lengths (kernels that read the cache in place
    # walk the block table; batched ones pad the shorter sequences).
    "long decodes": ((1, 7 * BLOCK_SIZE + 5), (1, 2 * BLOCK_SIZE + 1), (1, 3)),
    # A context of thousands of positions beside a short one: kernels that split a
    # sequence's positions into partitions and combine them (the cpu decode kernel's
    # are 1024) combine three here, the last partial.
    "split decodes": ((1, SPLIT_CONTEXT), (1, BLOCK_SIZE + 1)),
}
#: A softmax scale other than the shape's default (Gemma-2's query_pre_attn_scalar,
#: Granite's attention multiplier; YaRN's mscale^2 for MLA): a kernel that derives
#: the scale from the head size shows.
CUSTOM_SCALE_FACTOR = 1.44
Q_HEADS, KV_HEADS, HEAD_DIM = 4, 2, 32
MLA_HEADS, LATENT_DIM, ROPE_DIM = 2, 32, 16
FP8_SCALE = 0.5
SLIDING_WINDOW = 6
#: A window over the long decodes that starts inside a block and spans block edges.
LONG_SLIDING_WINDOW = 2 * BLOCK_SIZE + 3
#: A window over the split decode longer than a partition, starting inside a block.
SPLIT_SLIDING_WINDOW = 1024 + 3 * BLOCK_SIZE + 9


def _cache_dtypes(dtype: torch.dtype) -> tuple[torch.dtype, ...]:
    return (dtype, *FP8_DTYPES)


def _variants() -> Iterator[tuple[str, tuple[tuple[int, int], ...], int, float]]:
    """(name, batch, sliding window, scale factor): every batch at full causal, the
    mixed one and the long and split decodes windowed, the mixed one with a custom
    softmax scale."""
    for name, batch in BATCHES.items():
        yield name, batch, 0, 1.0
    yield f"mixed window={SLIDING_WINDOW}", BATCHES["mixed"], SLIDING_WINDOW, 1.0
    yield f"long decodes window={LONG_SLIDING_WINDOW}", BATCHES["long decodes"], LONG_SLIDING_WINDOW, 1.0
    yield f"split decodes window={SPLIT_SLIDING_WINDOW}", BATCHES["split decodes"], SPLIT_SLIDING_WINDOW, 1.0
    yield f"mixed scale x{CUSTOM_SCALE_FACTOR}", BATCHES["mixed"], 0, CUSTOM_SCALE_FACTOR


def paged_attention_cases(seed: int) -> Iterator[Case]:
    """query dtype x cache dtype (same or either fp8) x metadata index width."""
    for dtype in FLOAT_DTYPES:
        for cache_dtype in _cache_dtypes(dtype):
            for index_dtype in INDEX_DTYPES:
                for name, sequences, window, factor in _variants():
                    g = seeded(seed, "paged_attention", dtype, cache_dtype, index_dtype, name)
                    batch = paged_batch(g, sequences)
                    cache_shape = (batch.num_blocks, BLOCK_SIZE, KV_HEADS, HEAD_DIM)
                    scale = FP8_SCALE if cache_dtype in FP8_DTYPES else 1.0
                    args = {
                        "query": randn(g, (batch.num_tokens, Q_HEADS, HEAD_DIM), dtype),
                        "key_cache": randn(g, cache_shape, cache_dtype),
                        "value_cache": randn(g, cache_shape, cache_dtype),
                        **batch.metadata(index_dtype),
                        "scale": factor * HEAD_DIM**-0.5,
                        "sliding_window": window,
                        # Distinct, so a kernel that applies one to both shows.
                        "k_scale": scale,
                        "v_scale": scale / 2 if cache_dtype in FP8_DTYPES else 1.0,
                    }
                    yield Case("paged_attention", name, args)


def mla_attention_cases(seed: int) -> Iterator[Case]:
    """query dtype x latent cache dtype (same or either fp8) x metadata index width."""
    for dtype in FLOAT_DTYPES:
        for cache_dtype in _cache_dtypes(dtype):
            for index_dtype in INDEX_DTYPES:
                for name, sequences, _window, factor in _variants():
                    if _window:
                        continue  # MLA has no sliding window
                    g = seeded(seed, "mla_attention", dtype, cache_dtype, index_dtype, name)
                    batch = paged_batch(g, sequences)
                    tokens = batch.num_tokens
                    args = {
                        "q_latent": randn(g, (tokens, MLA_HEADS, LATENT_DIM), dtype),
                        "q_pe": randn(g, (tokens, MLA_HEADS, ROPE_DIM), dtype),
                        "kv_cache": randn(g, (batch.num_blocks, BLOCK_SIZE, LATENT_DIM + ROPE_DIM), cache_dtype),
                        **batch.metadata(index_dtype),
                        "scale": factor * (LATENT_DIM + ROPE_DIM) ** -0.5,
                        "kv_scale": FP8_SCALE if cache_dtype in FP8_DTYPES else 1.0,
                    }
                    yield Case("mla_attention", name, args)


CASES = {
    "paged_attention": paged_attention_cases,
    "mla_attention": mla_attention_cases,
}
