"""The decoder-only skeleton every family shares: embedding, pre-norm decoder layers,
final norm and the LM head. Families differ only in the attention and feed-forward
blocks they put in each layer. Under tensor parallelism the embedding and the head hold
this rank's vocabulary rows."""

from __future__ import annotations

from typing import Callable, Iterable, Protocol, Sequence

import torch

from ...op_contracts import OpDispatcher
from ..worker.attention import AttentionMetadata, KVCacheSpec, LayerKVCache
from ..distributed.sharding import rank_shard
from ..model_loader.model_config import ModelConfig
from .layers import RMSNorm, RotaryEmbedding
from .layers.mlp import RoutedExperts, SparseMoE
from .layers.parallel import ParallelLMHead, VocabParallelEmbedding
from .weights import WeightLoader


class Attention(Protocol):
    """An attention block: knows its cache layout, writes and reads its cache."""

    def kv_cache_spec(self) -> KVCacheSpec: ...

    def __call__(
        self, positions: torch.Tensor, hidden: torch.Tensor, attn: AttentionMetadata, kv_cache: LayerKVCache
    ) -> torch.Tensor: ...


class DecoderLayer:
    """x + attention(norm(x)), then + feed_forward(norm(.)); the residual adds are fused
    into the next norm (ops.fused_add_rms_norm)."""

    def __init__(
        self, input_norm: RMSNorm, attention: Attention, post_attention_norm: RMSNorm,
        feed_forward: Callable[[torch.Tensor], torch.Tensor],
    ) -> None:
        self.input_norm = input_norm
        self.attention = attention
        self.post_attention_norm = post_attention_norm
        self.feed_forward = feed_forward

    def __call__(
        self, positions: torch.Tensor, hidden: torch.Tensor, residual: torch.Tensor | None,
        attn: AttentionMetadata, kv_cache: LayerKVCache,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """(this layer's output, the residual stream before it) for the next layer's norm."""
        if residual is None:
            residual, hidden = hidden, self.input_norm(hidden)
        else:
            hidden, residual = self.input_norm(hidden, residual)
        hidden = self.attention(positions, hidden, attn, kv_cache)
        hidden, residual = self.post_attention_norm(hidden, residual)
        return self.feed_forward(hidden), residual


#: Builds decoder layer `layer` from the checkpoint: (weights, config, layer, rotary).
LayerBuilder = Callable[[WeightLoader, ModelConfig, int, RotaryEmbedding], DecoderLayer]


class CausalLM:
    """A decoder-only language model on the paged KV cache: the engine's view of a model."""

    def __init__(
        self, config: ModelConfig, ops: OpDispatcher, embedding: VocabParallelEmbedding,
        layers: Sequence[DecoderLayer], norm: RMSNorm, head: ParallelLMHead,
    ) -> None:
        self.config = config
        self.ops = ops
        self.embedding = embedding
        self.layers = list(layers)
        self.norm = norm
        self.head = head

    @classmethod
    def load(cls, weights: WeightLoader, config: ModelConfig, build_layer: LayerBuilder) -> CausalLM:
        """Every tensor (this rank's shard of it) from the checkpoint; `build_layer` makes
        each decoder layer."""
        hidden, vocab, parallel = config.hidden_size, config.vocab_size, weights.parallel
        rotary = RotaryEmbedding(weights.ops, config.rope, config.max_position_embeddings, weights.device)
        rows = rank_shard(parallel)
        table = weights.embedding("model.embed_tokens.weight", (vocab, hidden), rows)
        layers = [build_layer(weights, config, i, rotary) for i in range(config.num_layers)]
        norm = RMSNorm(weights.ops, weights.tensor("model.norm.weight", (hidden,)), config.rms_norm_eps)
        tied = config.tie_word_embeddings
        local_head = weights.lm_head("lm_head.weight", (vocab, hidden), rows, table if tied else None)
        comm = parallel.tp_comm()
        embedding = VocabParallelEmbedding(table, rows.bounds(vocab)[0], comm)
        head = ParallelLMHead(local_head, rows.extents(vocab), comm)
        return cls(config, weights.ops, embedding, layers, norm, head)

    def moe_blocks(self) -> list[RoutedExperts]:
        """The routed-expert blocks, for profile_run's worst-case routing."""
        return routed_experts(self.layers)

    def kv_cache_specs(self) -> list[KVCacheSpec]:
        """One cache spec per decoder layer, in layer order."""
        return [layer.attention.kv_cache_spec() for layer in self.layers]

    def forward(
        self, input_ids: torch.Tensor, positions: torch.Tensor, attn: AttentionMetadata,
        kv_caches: Sequence[LayerKVCache],
    ) -> torch.Tensor:
        """Final hidden states [T, H] of one flattened step (writes its K/V to the caches)."""
        return self.forward_features(input_ids, positions, attn, kv_caches, ())[0]

    def forward_features(
        self, input_ids: torch.Tensor, positions: torch.Tensor, attn: AttentionMetadata,
        kv_caches: Sequence[LayerKVCache], feature_layers: Sequence[int],
    ) -> tuple[torch.Tensor, list[torch.Tensor]]:
        """The final hidden states [T, H] and the residual stream [T, H] entering each of
        `feature_layers` (in that order; the features an EAGLE-3 head reads)."""
        hidden, residual = self.embedding(input_ids), None
        entering: dict[int, torch.Tensor] = {}
        for index, (layer, kv_cache) in enumerate(zip(self.layers, kv_caches, strict=True)):
            if index in feature_layers:
                entering[index] = hidden if residual is None else hidden + residual
            hidden, residual = layer(positions, hidden, residual, attn, kv_cache)
        hidden, _ = self.norm(hidden, residual)
        return hidden, [entering[index] for index in feature_layers]

    def compute_logits(self, hidden: torch.Tensor) -> torch.Tensor:
        """Logits [N, V] in fp32 for the rows of `hidden` [N, H] that need sampling; under
        tensor parallelism a collective (every rank calls it) leaves them on every rank."""
        return self.head(hidden)


def layer_norms(weights: WeightLoader, config: ModelConfig, prefix: str) -> tuple[RMSNorm, RMSNorm]:
    """A decoder layer's (input_layernorm, post_attention_layernorm)."""
    eps, shape = config.rms_norm_eps, (config.hidden_size,)
    return (
        RMSNorm(weights.ops, weights.tensor(f"{prefix}.input_layernorm.weight", shape), eps),
        RMSNorm(weights.ops, weights.tensor(f"{prefix}.post_attention_layernorm.weight", shape), eps),
    )


def routed_experts(layers: Iterable[DecoderLayer]) -> list[RoutedExperts]:
    """The routed-expert blocks of `layers`' sparse feed-forwards (profile_run routes
    them by their worst case)."""
    return [layer.feed_forward.routed for layer in layers if isinstance(layer.feed_forward, SparseMoE)]
