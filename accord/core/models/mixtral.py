"""GQA decoders with softmax top-k routed experts: MixtralForCausalLM (always
renormalised) and Qwen3MoeForCausalLM (q/k norm; `norm_topk_prob` decides; layers
outside the sparse set keep a dense MLP)."""

from __future__ import annotations

from typing import Callable

import torch

from ..model_loader.model_config import ModelConfig
from .causal_lm import DecoderLayer, layer_norms
from .layers import GatedMLP, GQAAttention, RotaryEmbedding, SparseMoE
from .weights import WeightLoader

#: The graph shards heads, channels and vocabulary across tensor-parallel ranks.
TENSOR_PARALLEL = True

#: Per architecture: (feed-forward prefix, expert weight names as gate, up, down).
NAMING = {
    "MixtralForCausalLM": ("block_sparse_moe", ("w1", "w3", "w2")),
    "Qwen3MoeForCausalLM": ("mlp", ("gate_proj", "up_proj", "down_proj")),
}


def build_layer(weights: WeightLoader, config: ModelConfig, layer: int, rotary: RotaryEmbedding) -> DecoderLayer:
    """Decoder layer `layer`: GQA attention and routed experts (or a dense MLP)."""
    prefix = f"model.layers.{layer}"
    input_norm, post_norm = layer_norms(weights, config, prefix)
    attention = GQAAttention.load(weights, f"{prefix}.self_attn", config, layer, rotary)
    ff_name, expert_names = NAMING[config.architecture]
    feed_forward: Callable[[torch.Tensor], torch.Tensor]
    moe = config.moe
    assert moe is not None, "an MoE architecture always parses an MoeConfig"
    if layer in moe.sparse_layers:
        router = weights.tensor(f"{prefix}.{ff_name}.gate.weight", (moe.num_experts, config.hidden_size))
        experts = weights.experts(
            f"{prefix}.{ff_name}.experts", moe.num_experts, expert_names, config.hidden_size, moe.intermediate_size
        )
        feed_forward = SparseMoE(weights.ops, moe, router, experts, parallel=weights.parallel)
    else:
        feed_forward = GatedMLP.load(weights, f"{prefix}.mlp", config.hidden_size, config.intermediate_size)
    return DecoderLayer(input_norm, attention, post_norm, feed_forward)
