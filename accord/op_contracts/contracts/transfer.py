"""The contract of KV conversion between two declared KV specs (cache dtype, scale and
block size): what a KV transfer runs when the instance that computed the KV and the
one that continues it keep their caches differently (a bf16 cache on one vendor's
pool, fp32 or fp8 on another's).

Both caches are [num_blocks, block_size, width]: a layer's key or value cache, or MLA's
latent cache, with its per-token dimensions flattened into one (the contracts' cache
layout is token-major, so that view is free). Tokens are addressed by flat slot
(block * block_size + offset) on each side, so the two block sizes are independent.
"""

from __future__ import annotations

import torch

from ..spec import FLOAT_DTYPES, FP8_DTYPES, INDEX_DTYPES, OpContract, ParamSpec, TensorSpec
from .common import ELEMENTWISE, STORED_EXACTLY

CACHE_DTYPES = FLOAT_DTYPES + FP8_DTYPES

KV_CONVERT = OpContract(
    name="kv_convert",
    doc=(
        "For each token t with d = dst_slots[t] >= 0 and s = src_slots[t]: v = "
        "src_cache[s // BSs, s % BSs] in fp32, times src_scale (fp32) when src_cache is "
        "fp8; dst_cache[d // BSd, d % BSd] = v / dst_scale (fp32 IEEE division) saturated "
        "to the fp8 range when dst_cache is fp8, else v; rounded to nearest even in "
        "dst_cache's dtype. A negative destination slot is skipped."
    ),
    tensors=(
        TensorSpec("src_cache", CACHE_DTYPES, ("NBs", "BSs", "W"), "the KV as the producer's spec holds it"),
        TensorSpec("dst_cache", CACHE_DTYPES, ("NBd", "BSd", "W"), "the consumer's cache", mutated=True),
        TensorSpec("src_slots", INDEX_DTYPES, ("T",), "flat source slot per token", index=True),
        TensorSpec("dst_slots", INDEX_DTYPES, ("T",), "flat destination slot per token, -1 skips", index=True),
    ),
    params=(
        ParamSpec("src_scale", float, 1.0, doc="the source's fp8 scale (ignored for a float source)"),
        ParamSpec("dst_scale", float, 1.0, doc="the destination's fp8 scale (ignored for a float destination)"),
    ),
    outputs=(),
    primary="src_cache",
    # Both sides do the same fp32 arithmetic and one rounding: every stored bit agrees.
    tolerance=ELEMENTWISE | {torch.float8_e4m3fn: 0.0},
    tolerance_key="dst_cache",
    ulps=STORED_EXACTLY,
    dtype_groups=(("src_slots", "dst_slots"),),
)

CONTRACTS = (KV_CONVERT,)
