"""The KV compressor (CSA and HCA) and the Lightning Indexer (CSA), over per-token state
kept in the paged cache.

Each token's projected [kv | gate] is written at its own slot (the compressor's state);
when a token closes a window, ops.kv_compress pools the window (and, for CSA, the
previous window's first half) into one entry, which is normed, rotated at the window's
first position and written at the closing token's slot. All state is a function of the
token prefix stored by position, so chunked prefill, preemption by recompute and prefix
caching need nothing beyond the block tables."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from ....op_contracts import OpDispatcher
from ...worker.attention import AttentionMetadata, KVCacheSpec
from ..layers import Linear, RMSNorm
from ..weights import WeightLoader
from .rotary import TrailingRotary


@dataclass(frozen=True)
class V4Step:
    """One step's layout as V4's layers read it: the attention metadata, each row's
    absolute position and the batch row (sequence) it belongs to."""

    attn: AttentionMetadata
    positions: torch.Tensor
    row_seq: torch.Tensor

    @classmethod
    def of(cls, attn: AttentionMetadata, positions: torch.Tensor) -> V4Step:
        """The layout of a flattened step."""
        q_lens = attn.query_start_loc[1:] - attn.query_start_loc[:-1]
        row_seq = torch.repeat_interleave(torch.arange(q_lens.shape[0], device=positions.device), q_lens.long())
        return cls(attn, positions, row_seq)


def write_rows(ops: OpDispatcher, rows: torch.Tensor, cache: torch.Tensor, slots: torch.Tensor) -> None:
    """Store rows [N, W] at their slots of a one-tensor-per-token cache [NB, BS, W]
    (ops.concat_and_cache_mla, whose two parts are simply the rows' halves)."""
    half = rows.shape[1] // 2
    ops.concat_and_cache_mla(rows[:, :half].contiguous(), rows[:, half:].contiguous(), cache, slots)


class KVCompressor:
    """One compressed series: every `rate` tokens pooled into one head_dim entry."""

    def __init__(
        self, ops: OpDispatcher, wkv: Linear, wgate: Linear, position_bias: torch.Tensor, norm: RMSNorm,
        rotary: TrailingRotary, rate: int, head_dim: int, overlap: bool,
    ) -> None:
        self.ops = ops
        self.wkv, self.wgate = wkv, wgate
        self.position_bias = position_bias
        self.norm = norm
        self.rotary = rotary
        self.rate = rate
        self.head_dim = head_dim
        self.overlap = overlap

    @classmethod
    def load(
        cls, weights: WeightLoader, prefix: str, hidden: int, head_dim: int, rate: int, overlap: bool, eps: float,
        rotary: TrailingRotary,
    ) -> KVCompressor:
        """From `prefix.{wkv,wgate,ape,norm}` (DeepSeek's names)."""
        width = (2 if overlap else 1) * head_dim
        return cls(
            weights.ops,
            weights.linear([f"{prefix}.wkv"], hidden, [width]),
            weights.linear([f"{prefix}.wgate"], hidden, [width]),
            weights.tensor(f"{prefix}.ape", (rate, width), torch.float32),
            RMSNorm(weights.ops, weights.tensor(f"{prefix}.norm.weight", (head_dim,)), eps),
            rotary, rate, head_dim, overlap,
        )

    def cache_specs(self) -> list[KVCacheSpec]:
        """The per-token state [kv | gate], then the compressed entries."""
        width = (2 if self.overlap else 1) * self.head_dim
        return [KVCacheSpec("mla", 1, 2 * width), KVCacheSpec("mla", 1, self.head_dim)]

    def __call__(self, x: torch.Tensor, step: V4Step, state_cache: torch.Tensor, entry_cache: torch.Tensor) -> None:
        """Store this step's state and the entries of the windows its tokens close."""
        self.ops.concat_and_cache_mla(self.wkv(x), self.wgate(x), state_cache, step.attn.slot_mapping)
        closing = ((step.positions + 1) % self.rate == 0).nonzero().squeeze(1)
        if closing.numel() == 0:
            return
        window_index = (step.positions[closing] + 1) // self.rate - 1
        pooled = self.ops.kv_compress(
            state_cache, self.position_bias, step.attn.block_tables, step.row_seq[closing], window_index,
            overlap=self.overlap,
        )
        entries = self.rotary(window_index * self.rate, self.norm(pooled).unsqueeze(1)).squeeze(1)
        write_rows(self.ops, entries, entry_cache, step.attn.slot_mapping[closing])


class Indexer:
    """The Lightning Indexer: its own overlapping compressor at index_head_dim, and
    ops.indexer_topk choosing each query's `top_k` compressed entries."""

    def __init__(
        self, ops: OpDispatcher, compressor: KVCompressor, wq_b: Linear, weights_proj: Linear,
        rotary: TrailingRotary, num_heads: int, head_dim: int, top_k: int,
    ) -> None:
        self.ops = ops
        self.compressor = compressor
        self.wq_b = wq_b
        self.weights_proj = weights_proj
        self.rotary = rotary
        self.num_heads = num_heads
        self.head_dim = head_dim
        self.top_k = top_k

    def cache_specs(self) -> list[KVCacheSpec]:
        """The indexer compressor's state and its compressed keys."""
        return self.compressor.cache_specs()

    def __call__(
        self, x: torch.Tensor, q_residual: torch.Tensor, step: V4Step, state_cache: torch.Tensor,
        key_cache: torch.Tensor,
    ) -> torch.Tensor:
        """Entry ids [T, top_k] (-1 where fewer entries are visible)."""
        self.compressor(x, step, state_cache, key_cache)
        q = self.wq_b(q_residual).view(-1, self.num_heads, self.head_dim)
        q = self.rotary(step.positions, q)
        head_weights = self.weights_proj(x).float() * self.num_heads**-0.5
        attn = step.attn
        return self.ops.indexer_topk(
            q, head_weights, key_cache, attn.block_tables, attn.seq_lens, attn.query_start_loc,
            top_k=self.top_k, compress_rate=self.compressor.rate, scale=self.head_dim**-0.5,
        )
