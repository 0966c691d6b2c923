"""The DeepSeek-V4 model: embedding into `hc_mult` streams, decoder layers (mHC around
attention and MoE), the hyper head, final norm and LM head; and its checkpoint names."""

from __future__ import annotations

import logging
from typing import Sequence

import torch
import torch.nn.functional as F

from ...worker.attention import AttentionMetadata, KVCacheSpec, LayerKVCache
from ...model_loader.hf_checkpoint import SafetensorsCheckpoint
from ...model_loader.model_config import ModelConfig
from ..layers import DenseLinear, Linear, RMSNorm
from ..layers.mlp import RoutedExperts
from ..weights import WeightLoader
from .attention import V4Attention
from .compressor import V4Step
from .hyper import HyperConnection, HyperHead
from .moe import V4MoE
from .rotary import TrailingRotary

logger = logging.getLogger(__name__)


class CheckpointNames:
    """DeepSeek's release names (`embed.weight`, `layers.N.attn.wq_a.weight`,
    `hc_head_fn`) or transformers' save of them (a `model.` prefix, `model.embed_tokens`,
    `model.hc_head.hc_fn`); `head.weight` in both."""

    def __init__(self, checkpoint: SafetensorsCheckpoint) -> None:
        self.transformers = "model.embed_tokens.weight" in checkpoint
        self.prefix = "model." if self.transformers else ""

    def layer(self, index: int) -> str:
        return f"{self.prefix}layers.{index}"

    @property
    def embed(self) -> str:
        return "model.embed_tokens.weight" if self.transformers else "embed.weight"

    @property
    def norm(self) -> str:
        return f"{self.prefix}norm.weight"

    def hc_head(self, part: str) -> str:
        return f"model.hc_head.hc_{part}" if self.transformers else f"hc_head_{part}"


class V4DecoderLayer:
    """mHC(attention) then mHC(MoE) over the residual streams."""

    def __init__(
        self, attn_hc: HyperConnection, attn_norm: RMSNorm, attention: V4Attention, ffn_hc: HyperConnection,
        ffn_norm: RMSNorm, moe: V4MoE,
    ) -> None:
        self.attn_hc, self.attn_norm, self.attention = attn_hc, attn_norm, attention
        self.ffn_hc, self.ffn_norm, self.moe = ffn_hc, ffn_norm, moe

    @classmethod
    def load(
        cls, weights: WeightLoader, prefix: str, config: ModelConfig, layer: int, rotaries: dict[str, TrailingRotary]
    ) -> V4DecoderLayer:
        v4, hidden, eps = config.v4, config.hidden_size, config.rms_norm_eps
        assert v4 is not None, "DeepseekV4 always parses its config"
        n = v4.hc_mult

        def hyper(kind: str) -> HyperConnection:
            mixes = (2 + n) * n
            return HyperConnection(
                weights.tensor(f"{prefix}.hc_{kind}_fn", (mixes, n * hidden), torch.float32),
                weights.tensor(f"{prefix}.hc_{kind}_base", (mixes,), torch.float32),
                weights.tensor(f"{prefix}.hc_{kind}_scale", (3,), torch.float32),
                n, v4.hc_sinkhorn_iters, v4.hc_eps, eps,
            )

        def norm(name: str) -> RMSNorm:
            return RMSNorm(weights.ops, weights.tensor(f"{prefix}.{name}.weight", (hidden,)), eps)

        return cls(
            hyper("attn"), norm("attn_norm"), V4Attention.load(weights, f"{prefix}.attn", config, layer, rotaries),
            hyper("ffn"), norm("ffn_norm"), V4MoE.load(weights, f"{prefix}.ffn", config, layer),
        )

    def __call__(
        self, streams: torch.Tensor, input_ids: torch.Tensor, step: V4Step, caches: LayerKVCache
    ) -> torch.Tensor:
        post, comb, collapsed = self.attn_hc(streams)
        streams = HyperConnection.merge(post, comb, self.attention(self.attn_norm(collapsed), step, caches), streams)
        post, comb, collapsed = self.ffn_hc(streams)
        return HyperConnection.merge(post, comb, self.moe(self.ffn_norm(collapsed), input_ids), streams)


class DeepseekV4:
    """The engine's view of a V4 model: cache specs, forward over a step, logits."""

    def __init__(
        self, config: ModelConfig, embed: torch.Tensor, layers: Sequence[V4DecoderLayer], hc_head: HyperHead,
        norm: RMSNorm, lm_head: Linear,
    ) -> None:
        assert config.v4 is not None, "DeepseekV4 always parses its config"
        self.config = config
        self.streams = config.v4.hc_mult
        self.embed = embed
        self.layers = list(layers)
        self.hc_head = hc_head
        self.norm = norm
        self.lm_head = lm_head
        self._caches_per_layer = [len(layer.attention.cache_specs()) for layer in self.layers]

    def moe_blocks(self) -> list[RoutedExperts]:
        """The routed-expert blocks, for profile_run's worst-case routing."""
        return [layer.moe.routed for layer in self.layers]

    def kv_cache_specs(self) -> list[KVCacheSpec]:
        """Every layer's caches in layer order (K=V, then compressor and indexer state)."""
        return [spec for layer in self.layers for spec in layer.attention.cache_specs()]

    def forward(
        self, input_ids: torch.Tensor, positions: torch.Tensor, attn: AttentionMetadata,
        kv_caches: Sequence[LayerKVCache],
    ) -> torch.Tensor:
        """Final hidden states [T, H] of one flattened step (writes its caches)."""
        step = V4Step.of(attn, positions)
        hidden = F.embedding(input_ids, self.embed)
        streams = hidden.unsqueeze(1).expand(-1, self.streams, -1).contiguous()
        flat = [cache[0] for cache in kv_caches]
        first = 0
        for layer, count in zip(self.layers, self._caches_per_layer, strict=True):
            streams = layer(streams, input_ids, step, tuple(flat[first : first + count]))
            first += count
        return self.norm(self.hc_head(streams))

    def compute_logits(self, hidden: torch.Tensor) -> torch.Tensor:
        """Logits [N, V] in fp32 for the rows of `hidden` [N, H] that need sampling."""
        return self.lm_head(hidden)


def load(weights: WeightLoader, config: ModelConfig) -> DeepseekV4:
    """Every tensor the graph uses, under DeepSeek's or transformers' names."""
    v4, hidden, eps = config.v4, config.hidden_size, config.rms_norm_eps
    assert v4 is not None, "DeepseekV4 always parses its config"
    if v4.num_nextn_predict_layers:
        logger.info(
            "checkpoint declares %d MTP layer(s); accord runs no speculative decoding, so they are not loaded",
            v4.num_nextn_predict_layers,
        )
    names = CheckpointNames(weights.checkpoint)
    rotaries = {
        kind: TrailingRotary(weights.ops, rope, config.max_position_embeddings, weights.device)
        for kind, rope in (("main", v4.rope_main), ("compress", v4.rope_compress))
    }
    layers = [V4DecoderLayer.load(weights, names.layer(i), config, i, rotaries) for i in range(config.num_layers)]
    n = v4.hc_mult
    hc_head = HyperHead(
        weights.tensor(names.hc_head("fn"), (n, n * hidden), torch.float32),
        weights.tensor(names.hc_head("base"), (n,), torch.float32),
        weights.tensor(names.hc_head("scale"), (1,), torch.float32),
        v4.hc_eps, eps,
    )
    return DeepseekV4(
        config,
        weights.tensor(names.embed, (config.vocab_size, hidden)),
        layers,
        hc_head,
        RMSNorm(weights.ops, weights.tensor(names.norm, (hidden,)), eps),
        # fp32 logits, through the contract: a bf16 rounding would tie close tokens.
        DenseLinear(weights.ops, weights.tensor("head.weight", (config.vocab_size, hidden)), out_dtype=torch.float32),
    )


def is_unused_tensor(name: str, config: ModelConfig) -> bool:
    """Multi-token-prediction layers (`mtp.*` in DeepSeek's release, or layers past
    num_hidden_layers): not run, since accord does no speculative decoding."""
    parts = name.removeprefix("model.").split(".")
    if parts[0] == "mtp":
        return True
    return parts[0] == "layers" and int(parts[1]) >= config.num_layers
