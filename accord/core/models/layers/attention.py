"""Grouped-query attention over the paged KV cache (Llama, Qwen2/3, Mixtral, Qwen3-MoE)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace

import torch

from ....op_contracts import OpDispatcher
from ...worker.attention import AttentionMetadata, KVCacheSpec, LayerKVCache
from ...distributed.sharding import head_shards
from ...model_loader.model_config import ModelConfig
from ..weights import WeightLoader
from .kv_scales import KVScales, load_kv_scales
from .linear import Linear
from .norm import RMSNorm
from .rotary import RotaryEmbedding


class GQAAttention:
    """Fused q/k/v projection, optional per-head q/k RMS norm (Qwen3), rotary, cache
    write (ops.reshape_and_cache), ops.paged_attention and the output projection."""

    def __init__(
        self,
        ops: OpDispatcher,
        qkv: Linear,
        o_proj: Linear,
        rotary: RotaryEmbedding,
        num_heads: int,
        num_kv_heads: int,
        head_dim: int,
        q_norm: RMSNorm | None = None,
        k_norm: RMSNorm | None = None,
        sliding_window: int = 0,
        kv_scales: KVScales | None = None,
    ) -> None:
        self.ops = ops
        self.qkv = qkv
        self.o_proj = o_proj
        self.rotary = rotary
        self.num_heads = num_heads
        self.num_kv_heads = num_kv_heads
        self.head_dim = head_dim
        self.q_norm = q_norm
        self.k_norm = k_norm
        self.sliding_window = sliding_window
        self.scale = head_dim**-0.5
        #: The fp8 cache's scales (the checkpoint's, or calibrated at start-up).
        self.kv_scales = kv_scales or KVScales()
        #: Sees this layer's keys and values [T, Hk, D] before the cache write while a
        #: calibration pass runs (accord.core.worker.kv_calibration); None otherwise.
        self.kv_observer: Callable[[torch.Tensor, torch.Tensor], None] | None = None

    @classmethod
    def load(
        cls, weights: WeightLoader, prefix: str, config: ModelConfig, layer: int, rotary: RotaryEmbedding,
        input_size: int | None = None,
    ) -> GQAAttention:
        """The attention of decoder layer `layer` from `prefix.{q,k,v,o}_proj` (+ q/k norms),
        q/k/v over `input_size` features (default the hidden size; EAGLE-3's layer reads 2H).
        Under tensor parallelism this rank holds its query heads and their key/value heads
        (replicated when there are fewer than ranks; see head_shards); o_proj sums over
        the ranks."""
        heads, kv_heads, head_dim = config.num_heads, config.num_kv_heads, config.head_dim
        q_shard, kv_shard = head_shards(weights.parallel, heads, kv_heads)
        qkv = weights.linear(
            [f"{prefix}.q_proj", f"{prefix}.k_proj", f"{prefix}.v_proj"],
            input_size or config.hidden_size,
            [heads * head_dim, kv_heads * head_dim, kv_heads * head_dim],
            bias=config.attention_bias,
            shards=[q_shard, kv_shard, kv_shard],
        )
        o_proj = weights.row_parallel_linear(
            f"{prefix}.o_proj", heads * head_dim, config.hidden_size, columns=replace(q_shard, dim=1)
        )
        q_norm = k_norm = None
        if config.qk_norm:
            q_norm = RMSNorm(weights.ops, weights.tensor(f"{prefix}.q_norm.weight", (head_dim,)), config.rms_norm_eps)
            k_norm = RMSNorm(weights.ops, weights.tensor(f"{prefix}.k_norm.weight", (head_dim,)), config.rms_norm_eps)
        window = config.sliding_windows[layer] if config.sliding_windows else 0
        return cls(
            weights.ops, qkv, o_proj, rotary, q_shard.extent(heads), kv_shard.extent(kv_heads), head_dim,
            q_norm, k_norm, window, load_kv_scales(weights, prefix),
        )

    def kv_cache_spec(self) -> KVCacheSpec:
        """Separate key and value caches of (num_kv_heads, head_dim) per token."""
        return KVCacheSpec("gqa", self.num_kv_heads, self.head_dim)

    def __call__(
        self, positions: torch.Tensor, hidden: torch.Tensor, attn: AttentionMetadata, kv_cache: LayerKVCache
    ) -> torch.Tensor:
        """hidden [T, H] -> attention output [T, H]; writes this step's keys and values."""
        tokens, head_dim = hidden.shape[0], self.head_dim
        q_size, kv_size = self.num_heads * head_dim, self.num_kv_heads * head_dim
        # The contracts take contiguous tensors, so the fused projection is split by copy
        # (none for one token, whose parts are contiguous already). split_with_sizes is
        # Tensor.split without its Python wrapper.
        q, k, v = (part.contiguous() for part in self.qkv(hidden).split_with_sizes([q_size, kv_size, kv_size], -1))
        if self.q_norm is not None and self.k_norm is not None:
            q = self.q_norm(q.view(-1, head_dim))
            k = self.k_norm(k.view(-1, head_dim))
        q, k = self.rotary(
            positions, q.view(tokens, self.num_heads, head_dim), k.view(tokens, self.num_kv_heads, head_dim)
        )
        v = v.view(tokens, self.num_kv_heads, head_dim)
        if self.kv_observer is not None:
            self.kv_observer(k, v)
        key_cache, value_cache = kv_cache
        scales = self.kv_scales
        self.ops.reshape_and_cache(
            k, v, key_cache, value_cache, attn.slot_mapping, k_scale=scales.k_scale, v_scale=scales.v_scale
        )
        out = self.ops.paged_attention(
            q, key_cache, value_cache, attn.block_tables, attn.seq_lens, attn.query_start_loc,
            scale=self.scale, sliding_window=self.sliding_window, k_scale=scales.k_scale, v_scale=scales.v_scale,
        )
        return self.o_proj(out.view(tokens, q_size))
