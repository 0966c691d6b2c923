"""DeepSeek-V3's multi-token-prediction (MTP) layer, `model.layers.{num_hidden_layers}`
in the checkpoint: it predicts the token after next from the target's last hidden state
and the next token, sharing the target's embedding and LM head (DeepSeek-V3 report,
section 2.2; vLLM's DeepSeekMultiTokenPredictorLayer).

At position i, with the target's final hidden state h_i and the token t_{i+1}:
    x = eh_proj(concat(enorm(embed(t_{i+1})), hnorm(h_i)))   (embed zeroed at position 0)
    h' = decoder_layer(x) + its residual                       (MLA + the MoE block)
    logits = lm_head(shared_head.norm(h'))                     (the prediction of t_{i+2})
h' is also the "previous hidden state" of the next position when the layer drafts on.
The checkpoint's copies of the embedding and the head (`embed_tokens`,
`shared_head.head`) are not read: the target's are used.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence

import torch

from ..model_loader.model_config import ModelConfig
from ..worker.attention import AttentionMetadata, KVCacheSpec, LayerKVCache
from .causal_lm import CausalLM, DecoderLayer, routed_experts
from .deepseek_v3 import build_layer
from .layers import Linear, RMSNorm, RotaryEmbedding
from .layers.mlp import RoutedExperts
from .weights import WeightLoader


class MtpLayer:
    """One MTP layer over its own latent KV cache, on the target's embedding and head."""

    #: It reads the target's final hidden states (no other layer's features).
    feature_layers: tuple[int, ...] = ()

    def __init__(self, target: CausalLM, enorm: RMSNorm, hnorm: RMSNorm, eh_proj: Linear, layer: DecoderLayer,
                 head_norm: RMSNorm) -> None:
        self.target = target
        self.enorm = enorm
        self.hnorm = hnorm
        self.eh_proj = eh_proj
        self.layer = layer
        self.head_norm = head_norm

    @classmethod
    def load(cls, weights: WeightLoader, config: ModelConfig, target: CausalLM) -> MtpLayer:
        """The first MTP layer's tensors (`model.layers.{num_hidden_layers}.*`); its
        decoder block is a MoE layer like the target's sparse ones."""
        index, hidden, eps = config.num_layers, config.hidden_size, config.rms_norm_eps
        prefix = f"model.layers.{index}"
        assert config.moe is not None, "DeepseekV3 always parses an MoeConfig"
        # The MTP block is sparse whatever first_k_dense_replace says of the main layers.
        sparse = dataclasses.replace(config.moe, sparse_layers=config.moe.sparse_layers | {index})
        rotary = RotaryEmbedding(weights.ops, config.rope, config.max_position_embeddings, weights.device)
        layer = build_layer(weights, dataclasses.replace(config, moe=sparse), index, rotary)

        def norm(name: str) -> RMSNorm:
            return RMSNorm(weights.ops, weights.tensor(f"{prefix}.{name}.weight", (hidden,)), eps)

        eh_proj = weights.linear([f"{prefix}.eh_proj"], 2 * hidden, [hidden])
        return cls(target, norm("enorm"), norm("hnorm"), eh_proj, layer, norm("shared_head.norm"))

    def kv_cache_specs(self) -> list[KVCacheSpec]:
        """Its attention's latent cache (one layer)."""
        return [self.layer.attention.kv_cache_spec()]

    def target_features(self, hidden: torch.Tensor) -> torch.Tensor:
        """The h_i it reads: the target's final hidden states, as they are."""
        return hidden

    def moe_blocks(self) -> list[RoutedExperts]:
        """Its decoder block's routed experts."""
        return routed_experts([self.layer])

    def forward(self, input_ids: torch.Tensor, positions: torch.Tensor, previous_hidden: torch.Tensor,
                attn: AttentionMetadata, kv_caches: Sequence[LayerKVCache]) -> torch.Tensor:
        """h' [T, H] of the tokens `input_ids` (t_{i+1}) after the hidden states
        `previous_hidden` (h_i) at `positions` (i); writes this layer's latents."""
        embeds = self.target.embedding(input_ids)
        # Position 0 has no token before it that the layer was trained to see (vLLM's masking).
        embeds = torch.where((positions == 0)[:, None], torch.zeros_like(embeds), embeds)
        x = self.eh_proj(torch.cat([self.enorm(embeds), self.hnorm(previous_hidden)], dim=-1))
        out, residual = self.layer(positions, x, None, attn, kv_caches[0])
        return out + residual

    def compute_logits(self, hidden: torch.Tensor) -> torch.Tensor:
        """Logits [N, V] fp32 of the token after next, through the target's head."""
        return self.target.compute_logits(self.head_norm(hidden))
