"""DeepSeek-V4 attention: low-rank queries, one shared K=V head over a sliding window,
plus compressed entries (HCA: all closed windows; CSA: the indexer's top-k), attention
sinks, the inverse rotation of the output, and the grouped low-rank output projection."""

from __future__ import annotations

import torch

from ....op_contracts import OpDispatcher
from ...worker.attention import KVCacheSpec, LayerKVCache
from ...model_loader.model_config import ModelConfig
from .config import DeepseekV4Config
from ..layers import Linear, RMSNorm
from ..weights import WeightLoader
from .compressor import Indexer, KVCompressor, V4Step, write_rows
from .rotary import TrailingRotary


class V4Attention:
    """One layer's attention; its caches are the K=V cache, then the compressor's and
    the indexer's (see cache_specs)."""

    def __init__(
        self, ops: OpDispatcher, v4: DeepseekV4Config, num_heads: int, head_dim: int, wq_a: Linear, q_norm: RMSNorm,
        wq_b: Linear, wkv: Linear, kv_norm: RMSNorm, wo_a: torch.Tensor, wo_b: Linear, sinks: torch.Tensor,
        rotary: TrailingRotary, compressor: KVCompressor | None, indexer: Indexer | None, eps: float,
    ) -> None:
        self.ops = ops
        self.v4 = v4
        self.num_heads, self.head_dim = num_heads, head_dim
        self.wq_a, self.q_norm, self.wq_b = wq_a, q_norm, wq_b
        self.wkv, self.kv_norm = wkv, kv_norm
        self.wo_b = wo_b
        # wo_a is block-diagonal: group g maps its heads' slice to o_lora_rank dims.
        groups = v4.o_groups
        self.wo_a = wo_a.view(groups, v4.o_lora_rank, -1).transpose(1, 2).contiguous()  # [G, in, o_lora]
        self.sinks = sinks
        self.rotary = rotary
        self.compressor = compressor
        self.indexer = indexer
        self.q_head_norm = torch.ones(head_dim, dtype=wo_a.dtype, device=wo_a.device)
        self.eps = eps

    @classmethod
    def load(
        cls, weights: WeightLoader, prefix: str, config: ModelConfig, layer: int, rotaries: dict[str, TrailingRotary]
    ) -> V4Attention:
        """From DeepSeek's `prefix.{wq_a,q_norm,wq_b,wkv,norm,wo_a,wo_b,attn_sink}`, and
        `compressor.*` / `indexer.*` on CSA and HCA layers."""
        v4, hidden, heads, dim, eps = config.v4, config.hidden_size, config.num_heads, config.head_dim, config.rms_norm_eps
        assert v4 is not None, "DeepseekV4 always parses its config"
        ops = weights.ops
        rate = v4.compress_rate(layer)
        rotary = rotaries["main" if rate == 0 else "compress"]
        compressor = indexer = None
        csa = v4.layer_types[layer] == "compressed_sparse_attention"
        if rate:
            compressor = KVCompressor.load(weights, f"{prefix}.compressor", hidden, dim, rate, csa, eps, rotary)
        if csa:
            index_dim = v4.index_head_dim
            indexer = Indexer(
                ops,
                KVCompressor.load(weights, f"{prefix}.indexer.compressor", hidden, index_dim, rate, True, eps, rotary),
                weights.linear([f"{prefix}.indexer.wq_b"], v4.q_lora_rank, [v4.index_n_heads * index_dim]),
                weights.linear([f"{prefix}.indexer.weights_proj"], hidden, [v4.index_n_heads]),
                rotary, v4.index_n_heads, index_dim, v4.index_topk,
            )
        return cls(
            ops, v4, heads, dim,
            weights.linear([f"{prefix}.wq_a"], hidden, [v4.q_lora_rank]),
            RMSNorm(ops, weights.tensor(f"{prefix}.q_norm.weight", (v4.q_lora_rank,)), eps),
            weights.linear([f"{prefix}.wq_b"], v4.q_lora_rank, [heads * dim]),
            weights.linear([f"{prefix}.wkv"], hidden, [dim]),
            RMSNorm(ops, weights.tensor(f"{prefix}.norm.weight", (dim,)), eps),
            weights.dense_weight(f"{prefix}.wo_a", (v4.o_groups * v4.o_lora_rank, heads * dim // v4.o_groups)),
            weights.linear([f"{prefix}.wo_b"], v4.o_groups * v4.o_lora_rank, [hidden]),
            weights.tensor(f"{prefix}.attn_sink", (heads,), torch.float32),
            rotary, compressor, indexer, eps,
        )

    def cache_specs(self) -> list[KVCacheSpec]:
        """K=V of the sliding branch, then compressor state + entries, then indexer
        state + keys (each one tensor per token, the `mla` layout)."""
        specs = [KVCacheSpec("mla", 1, self.head_dim)]
        for part in (self.compressor, self.indexer):
            if part is not None:
                specs.extend(part.cache_specs())
        return specs

    def __call__(self, x: torch.Tensor, step: V4Step, caches: LayerKVCache) -> torch.Tensor:
        """x [T, hidden] -> attention output [T, hidden]; writes this step's caches."""
        tokens, heads, dim = x.shape[0], self.num_heads, self.head_dim
        attn = step.attn
        q_residual = self.q_norm(self.wq_a(x))
        q = self.ops.rms_norm(self.wq_b(q_residual).view(-1, dim), self.q_head_norm, eps=self.eps).view(tokens, heads, dim)
        q = self.rotary(step.positions, q)
        kv = self.rotary(step.positions, self.kv_norm(self.wkv(x)).unsqueeze(1)).squeeze(1)
        kv_cache, *rest = caches
        write_rows(self.ops, kv, kv_cache, attn.slot_mapping)
        compressed_cache = topk_ids = None
        if self.compressor is not None:
            state_cache, compressed_cache = rest[0], rest[1]
            self.compressor(x, step, state_cache, compressed_cache)
        if self.indexer is not None:
            topk_ids = self.indexer(x, q_residual, step, rest[2], rest[3])
        out = self.ops.compressed_attention(
            q, kv_cache, compressed_cache, self.sinks, topk_ids, attn.block_tables, attn.seq_lens,
            attn.query_start_loc, scale=dim**-0.5, sliding_window=self.v4.sliding_window,
            compress_rate=0 if self.compressor is None else self.compressor.rate,
        )
        # K = V carries the rotation on its trailing dims; turning the output back by the
        # query's angle leaves each entry's contribution relative to the query.
        out = self.rotary(step.positions, out, inverse=True)
        grouped = torch.bmm(out.reshape(tokens, self.v4.o_groups, -1).transpose(0, 1), self.wo_a)
        return self.wo_b(grouped.transpose(0, 1).reshape(tokens, -1))
