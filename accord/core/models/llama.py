"""Dense GQA decoders: LlamaForCausalLM, Qwen2ForCausalLM (q/k/v bias) and
Qwen3ForCausalLM (per-head q/k norm). One graph; config.json's fields select the
differences."""

from __future__ import annotations

from ..model_loader.model_config import ModelConfig
from .causal_lm import DecoderLayer, layer_norms
from .layers import GatedMLP, GQAAttention, RotaryEmbedding
from .weights import WeightLoader

#: The graph shards heads, channels and vocabulary across tensor-parallel ranks.
TENSOR_PARALLEL = True


def build_layer(weights: WeightLoader, config: ModelConfig, layer: int, rotary: RotaryEmbedding) -> DecoderLayer:
    """Decoder layer `layer`: GQA attention and a gated MLP."""
    prefix = f"model.layers.{layer}"
    input_norm, post_norm = layer_norms(weights, config, prefix)
    attention = GQAAttention.load(weights, f"{prefix}.self_attn", config, layer, rotary)
    mlp = GatedMLP.load(weights, f"{prefix}.mlp", config.hidden_size, config.intermediate_size)
    return DecoderLayer(input_norm, attention, post_norm, mlp)
