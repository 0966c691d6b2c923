"""DeepseekV3ForCausalLM: multi-head latent attention over a latent KV cache, and MoE
with sigmoid scoring, correction bias, group-limited top-k, shared experts and
routed_scaling_factor; the first `first_k_dense_replace` layers keep a dense MLP.

Attention always runs absorbed: W_UK (from kv_b_proj) turns q_nope into a latent query,
ops.mla_attention attends over cached concat(kv_c, k_pe), and W_UV maps the latent
output back to per-head values. The cache thus holds kv_lora_rank + rope dims per token.
"""

from __future__ import annotations

import torch

from ...op_contracts import OpDispatcher
from ..worker.attention import AttentionMetadata, KVCacheSpec, LayerKVCache
from ..distributed.sharding import split_evenly
from ..model_loader.model_config import MlaConfig, ModelConfig
from .causal_lm import DecoderLayer, layer_norms
from .layers import GatedMLP, Linear, RMSNorm, RotaryEmbedding, SparseMoE
from .layers.rotary import yarn_mscale
from .weights import WeightLoader

#: The graph shards heads, channels and vocabulary across tensor-parallel ranks.
TENSOR_PARALLEL = True


class MLAAttention:
    """DeepSeek's latent attention with absorbed up-projections."""

    def __init__(
        self,
        ops: OpDispatcher,
        mla: MlaConfig,
        num_heads: int,
        q_proj: Linear,
        q_a_norm: RMSNorm | None,
        q_a_proj: Linear | None,
        kv_a_proj: Linear,
        kv_a_norm: RMSNorm,
        kv_b_proj: torch.Tensor,
        o_proj: Linear,
        rotary: RotaryEmbedding,
        scale: float,
    ) -> None:
        self.ops = ops
        self.mla = mla
        self.num_heads = num_heads
        self.q_proj = q_proj
        self.q_a_norm = q_a_norm
        self.q_a_proj = q_a_proj
        self.kv_a_proj = kv_a_proj
        self.kv_a_norm = kv_a_norm
        self.o_proj = o_proj
        self.rotary = rotary
        self.scale = scale
        # kv_b_proj rows are per head [nope | v], columns the latent: split once here.
        per_head = kv_b_proj.view(num_heads, mla.qk_nope_head_dim + mla.v_head_dim, mla.kv_lora_rank)
        self.w_uk = per_head[:, : mla.qk_nope_head_dim].contiguous()  # [H, nope, L]
        self.w_uv = per_head[:, mla.qk_nope_head_dim :].transpose(1, 2).contiguous()  # [H, L, v]

    @classmethod
    def load(cls, weights: WeightLoader, prefix: str, config: ModelConfig, rotary: RotaryEmbedding) -> MLAAttention:
        """From DeepSeek's q_a/q_b (or q_proj), kv_a_proj_with_mqa, kv_b_proj and o_proj.
        Under tensor parallelism this rank holds heads / tp heads (their rows of q_b and
        kv_b, their columns of o_proj); the latent projections and the latent cache are
        whole on every rank."""
        mla, heads, hidden, eps = config.mla, config.num_heads, config.hidden_size, config.rms_norm_eps
        assert mla is not None, "DeepseekV3 always parses an MlaConfig"
        qk_head_dim = mla.qk_nope_head_dim + mla.qk_rope_head_dim
        q_out = [heads * qk_head_dim]
        by_head = split_evenly(weights.parallel, heads, "num_attention_heads")
        if mla.q_lora_rank is None:
            q_a_proj, q_a_norm = None, None
            q_proj = weights.linear([f"{prefix}.q_proj"], hidden, q_out, shards=[by_head])
        else:
            q_a_proj = weights.linear([f"{prefix}.q_a_proj"], hidden, [mla.q_lora_rank])
            q_a_norm = RMSNorm(weights.ops, weights.tensor(f"{prefix}.q_a_layernorm.weight", (mla.q_lora_rank,)), eps)
            q_proj = weights.linear([f"{prefix}.q_b_proj"], mla.q_lora_rank, q_out, shards=[by_head])
        kv_a_proj = weights.linear(
            [f"{prefix}.kv_a_proj_with_mqa"], hidden, [mla.kv_lora_rank + mla.qk_rope_head_dim]
        )
        kv_a_norm = RMSNorm(weights.ops, weights.tensor(f"{prefix}.kv_a_layernorm.weight", (mla.kv_lora_rank,)), eps)
        kv_b_proj = weights.dense_weight(
            f"{prefix}.kv_b_proj", (heads * (mla.qk_nope_head_dim + mla.v_head_dim), mla.kv_lora_rank), by_head
        )
        o_proj = weights.row_parallel_linear(f"{prefix}.o_proj", heads * mla.v_head_dim, hidden)
        scale = qk_head_dim**-0.5
        rope = config.rope
        if rope.rope_type != "default" and rope.mscale_all_dim:
            scale *= yarn_mscale(rope.factor, rope.mscale_all_dim) ** 2
        return cls(
            weights.ops, mla, by_head.extent(heads), q_proj, q_a_norm, q_a_proj, kv_a_proj, kv_a_norm, kv_b_proj,
            o_proj, rotary, scale,
        )

    def kv_cache_spec(self) -> KVCacheSpec:
        """One latent cache entry per token: kv_lora_rank + rope dims."""
        return KVCacheSpec("mla", 1, self.mla.kv_lora_rank + self.mla.qk_rope_head_dim)

    def __call__(
        self, positions: torch.Tensor, hidden: torch.Tensor, attn: AttentionMetadata, kv_cache: LayerKVCache
    ) -> torch.Tensor:
        """hidden [T, H] -> attention output [T, H]; writes this step's latents."""
        mla, heads, tokens = self.mla, self.num_heads, hidden.shape[0]
        nope, rope_dim, latent = mla.qk_nope_head_dim, mla.qk_rope_head_dim, mla.kv_lora_rank
        q_input = hidden if self.q_a_proj is None else self.q_a_norm(self.q_a_proj(hidden))
        q = self.q_proj(q_input).view(tokens, heads, nope + rope_dim)
        kv_a = self.kv_a_proj(hidden)
        kv_c = self.kv_a_norm(kv_a[:, :latent].contiguous())
        q_pe, k_pe = self.rotary(
            positions, q[..., nope:].contiguous(), kv_a[:, latent:].contiguous().view(tokens, 1, rope_dim)
        )
        (latent_cache,) = kv_cache
        self.ops.concat_and_cache_mla(kv_c, k_pe.view(tokens, rope_dim), latent_cache, attn.slot_mapping)
        q_latent = torch.bmm(q[..., :nope].transpose(0, 1), self.w_uk).transpose(0, 1).contiguous()
        out = self.ops.mla_attention(
            q_latent, q_pe, latent_cache, attn.block_tables, attn.seq_lens, attn.query_start_loc, scale=self.scale
        )
        values = torch.bmm(out.transpose(0, 1), self.w_uv)  # [H, T, v]
        return self.o_proj(values.transpose(0, 1).reshape(tokens, heads * mla.v_head_dim))


def build_layer(weights: WeightLoader, config: ModelConfig, layer: int, rotary: RotaryEmbedding) -> DecoderLayer:
    """Decoder layer `layer`: MLA, then routed + shared experts or (first layers) a dense MLP."""
    prefix, hidden, moe = f"model.layers.{layer}", config.hidden_size, config.moe
    assert moe is not None, "DeepseekV3 always parses an MoeConfig"
    input_norm, post_norm = layer_norms(weights, config, prefix)
    attention = MLAAttention.load(weights, f"{prefix}.self_attn", config, rotary)
    if layer not in moe.sparse_layers:
        return DecoderLayer(
            input_norm, attention, post_norm, GatedMLP.load(weights, f"{prefix}.mlp", hidden, config.intermediate_size)
        )
    # Hugging Face keeps the router and its bias in fp32; so does this graph.
    router = weights.tensor(f"{prefix}.mlp.gate.weight", (moe.num_experts, hidden), torch.float32)
    bias = None
    if moe.correction_bias:
        bias = weights.tensor(f"{prefix}.mlp.gate.e_score_correction_bias", (moe.num_experts,), torch.float32)
    experts = weights.experts(
        f"{prefix}.mlp.experts", moe.num_experts, ("gate_proj", "up_proj", "down_proj"), hidden, moe.intermediate_size
    )
    shared = None
    if moe.num_shared_experts:
        shared = GatedMLP.load(
            weights, f"{prefix}.mlp.shared_experts", hidden, moe.intermediate_size * moe.num_shared_experts,
            reduce=False,
        )
    feed_forward = SparseMoE(weights.ops, moe, router, experts, bias, shared, weights.parallel)
    return DecoderLayer(input_norm, attention, post_norm, feed_forward)


def is_unused_tensor(name: str, config: ModelConfig) -> bool:
    """DeepSeek checkpoints carry next-token-prediction layers past num_hidden_layers;
    this graph does not use them (Hugging Face ignores them too)."""
    parts = name.split(".")
    return name.startswith("model.layers.") and int(parts[2]) >= config.num_layers
