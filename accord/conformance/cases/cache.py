"""Cases for the KV cache writers, reshape_and_cache and concat_and_cache_mla: token
counts below, on and just past a block, padding slots, and float and fp8 caches; and
for kv_convert: every pair of cache dtypes, two block sizes on either side, fp8 scales
and values beyond the fp8 range."""

from __future__ import annotations

from typing import Iterator

import torch

from ...op_contracts import FLOAT_DTYPES, FP8_DTYPES, FP8_MAX, INDEX_DTYPES
from ..case import Case, randn, seeded
from .paged import BLOCK_SIZE, slot_mapping

NUM_BLOCKS = 4
TOKEN_COUNTS = (1, BLOCK_SIZE, BLOCK_SIZE + 1)
#: Values this many times an fp8 cache's largest finite value (after the scale): a
#: store must saturate them, never produce NaN or inf.
BEYOND_FP8_RANGE = 4.0
KV_HEADS, HEAD_DIM = 2, 16
LATENT_DIM, ROPE_DIM = 32, 16
#: fp8 caches store value / scale; a scale != 1 checks that it is applied.
FP8_SCALE = 0.25


def _cache_dtypes(dtype: torch.dtype) -> tuple[torch.dtype, ...]:
    return (dtype, *FP8_DTYPES)


def reshape_and_cache_cases(seed: int) -> Iterator[Case]:
    """key/value dtype x cache dtype (same or either fp8) x slot index width."""
    for dtype in FLOAT_DTYPES:
        for cache_dtype in _cache_dtypes(dtype):
            for index_dtype in INDEX_DTYPES:
                for tokens in TOKEN_COUNTS:
                    g = seeded(seed, "reshape_and_cache", dtype, cache_dtype, index_dtype, tokens)
                    cache_shape = (NUM_BLOCKS, BLOCK_SIZE, KV_HEADS, HEAD_DIM)
                    scale = FP8_SCALE if cache_dtype in FP8_DTYPES else 1.0
                    args = {
                        "key": randn(g, (tokens, KV_HEADS, HEAD_DIM), dtype),
                        "value": randn(g, (tokens, KV_HEADS, HEAD_DIM), dtype),
                        # Prior contents: slots the op must not touch keep them.
                        "key_cache": randn(g, cache_shape, cache_dtype),
                        "value_cache": randn(g, cache_shape, cache_dtype),
                        "slot_mapping": slot_mapping(g, tokens, NUM_BLOCKS * BLOCK_SIZE, index_dtype),
                        "k_scale": scale,
                        "v_scale": scale / 2,
                    }
                    yield Case("reshape_and_cache", f"T={tokens} BS={BLOCK_SIZE}", args)
                if cache_dtype in FP8_DTYPES:
                    yield _saturating_case(seed, dtype, cache_dtype)


def _saturating_case(seed: int, dtype: torch.dtype, cache_dtype: torch.dtype) -> Case:
    """Every other element beyond the fp8 range (both signs), at int64 slots."""
    tokens = BLOCK_SIZE
    g = seeded(seed, "reshape_and_cache saturating", dtype, cache_dtype)
    cache_shape = (NUM_BLOCKS, BLOCK_SIZE, KV_HEADS, HEAD_DIM)
    big = BEYOND_FP8_RANGE * FP8_MAX[cache_dtype] * FP8_SCALE
    outliers = torch.zeros(tokens, KV_HEADS, HEAD_DIM)
    outliers[..., ::2] = big * torch.randn(tokens, KV_HEADS, HEAD_DIM // 2, generator=g).sign()
    args = {
        "key": (randn(g, (tokens, KV_HEADS, HEAD_DIM), torch.float32) + outliers).to(dtype),
        "value": (randn(g, (tokens, KV_HEADS, HEAD_DIM), torch.float32) - outliers).to(dtype),
        "key_cache": randn(g, cache_shape, cache_dtype),
        "value_cache": randn(g, cache_shape, cache_dtype),
        "slot_mapping": slot_mapping(g, tokens, NUM_BLOCKS * BLOCK_SIZE, torch.int64),
        "k_scale": FP8_SCALE,
        "v_scale": FP8_SCALE,
    }
    return Case("reshape_and_cache", f"T={tokens} beyond fp8 range", args)


def concat_and_cache_mla_cases(seed: int) -> Iterator[Case]:
    """latent dtype x cache dtype (same or either fp8) x slot index width."""
    for dtype in FLOAT_DTYPES:
        for cache_dtype in _cache_dtypes(dtype):
            for index_dtype in INDEX_DTYPES:
                for tokens in TOKEN_COUNTS:
                    g = seeded(seed, "concat_and_cache_mla", dtype, cache_dtype, index_dtype, tokens)
                    args = {
                        "kv_c": randn(g, (tokens, LATENT_DIM), dtype),
                        "k_pe": randn(g, (tokens, ROPE_DIM), dtype),
                        "kv_cache": randn(g, (NUM_BLOCKS, BLOCK_SIZE, LATENT_DIM + ROPE_DIM), cache_dtype),
                        "slot_mapping": slot_mapping(g, tokens, NUM_BLOCKS * BLOCK_SIZE, index_dtype),
                        "scale": FP8_SCALE if cache_dtype in FP8_DTYPES else 1.0,
                    }
                    yield Case("concat_and_cache_mla", f"T={tokens} BS={BLOCK_SIZE}", args)


#: kv_convert's (source, destination) block sizes: a producer's 16-token blocks into a
#: consumer's 8 and back, and one token per block (a transfer file's rows).
CONVERT_BLOCK_SIZES = ((BLOCK_SIZE, BLOCK_SIZE // 2), (BLOCK_SIZE // 2, BLOCK_SIZE), (1, BLOCK_SIZE))
#: The row width of a converted cache: KV_HEADS x HEAD_DIM flattened.
CONVERT_WIDTH = KV_HEADS * HEAD_DIM


def _convert_args(
    g: torch.Generator, src_dtype: torch.dtype, dst_dtype: torch.dtype, block_sizes: tuple[int, int],
    tokens: int, index_dtype: torch.dtype, values: torch.Tensor,
) -> dict:
    src_bs, dst_bs = block_sizes
    src_blocks, dst_blocks = -(-2 * tokens // src_bs), -(-2 * tokens // dst_bs)
    src_cache = randn(g, (src_blocks, src_bs, CONVERT_WIDTH), torch.float32)
    src_slots = torch.randperm(src_blocks * src_bs, generator=g)[:tokens]
    src_cache.view(-1, CONVERT_WIDTH)[src_slots] = values
    return {
        # An fp8 source holds value / scale, as its cache writer stored it.
        "src_cache": (src_cache / FP8_SCALE if src_dtype in FP8_DTYPES else src_cache).to(src_dtype),
        # Prior contents: slots the op must not touch keep them.
        "dst_cache": randn(g, (dst_blocks, dst_bs, CONVERT_WIDTH), dst_dtype),
        "src_slots": src_slots.to(index_dtype),
        "dst_slots": slot_mapping(g, tokens, dst_blocks * dst_bs, index_dtype),
        "src_scale": FP8_SCALE if src_dtype in FP8_DTYPES else 1.0,
        "dst_scale": FP8_SCALE / 2 if dst_dtype in FP8_DTYPES else 1.0,
    }


def kv_convert_cases(seed: int) -> Iterator[Case]:
    """source dtype x destination dtype (every cache dtype on each side) x block sizes
    (at alternating slot index widths), then values beyond the fp8 range into each fp8
    cache."""
    cache_dtypes = (*FLOAT_DTYPES, *FP8_DTYPES)
    tokens = BLOCK_SIZE + 1
    for src_dtype in cache_dtypes:
        for dst_dtype in cache_dtypes:
            # Each block-size pair at one slot width, both widths covered.
            for block_sizes, index_dtype in zip(CONVERT_BLOCK_SIZES, INDEX_DTYPES * 2):
                g = seeded(seed, "kv_convert", src_dtype, dst_dtype, block_sizes, index_dtype)
                values = randn(g, (tokens, CONVERT_WIDTH), torch.float32)
                args = _convert_args(g, src_dtype, dst_dtype, block_sizes, tokens, index_dtype, values)
                yield Case("kv_convert", f"T={tokens} BS={block_sizes[0]}->{block_sizes[1]}", args)
    for src_dtype in FLOAT_DTYPES:
        for dst_dtype in FP8_DTYPES:
            g = seeded(seed, "kv_convert saturating", src_dtype, dst_dtype)
            big = BEYOND_FP8_RANGE * FP8_MAX[dst_dtype] * FP8_SCALE
            values = randn(g, (tokens, CONVERT_WIDTH), torch.float32)
            values[:, ::2] = big * values[:, ::2].sign()
            args = _convert_args(g, src_dtype, dst_dtype, CONVERT_BLOCK_SIZES[0], tokens, torch.int64, values)
            yield Case("kv_convert", f"T={tokens} beyond fp8 range", args)


CASES = {
    "reshape_and_cache": reshape_and_cache_cases,
    "concat_and_cache_mla": concat_and_cache_mla_cases,
    "kv_convert": kv_convert_cases,
}
