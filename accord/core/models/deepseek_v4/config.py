"""DeepSeek-V4's own config.json fields (the per-layer attention and MoE schedules,
compression, the indexer, mHC streams, two rotary tables), parsed beside its graph;
the generic fields are model_config's."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any, Mapping

from ...model_loader.model_config import (
    ModelConfig,
    ModelConfigError,
    MoeConfig,
    RopeConfig,
    parse_rope,
    required_field,
)


@dataclass(frozen=True)
class DeepseekV4Config:
    """DeepSeek-V4's own fields: the per-layer attention and MoE schedules, compression
    rates, the Lightning Indexer, mHC streams, the grouped output projection and the
    two rotary tables (`main` for sliding layers, `compress` for CSA/HCA layers)."""

    layer_types: tuple[str, ...]
    mlp_layer_types: tuple[str, ...]
    csa_rate: int
    hca_rate: int
    sliding_window: int
    q_lora_rank: int
    o_groups: int
    o_lora_rank: int
    index_n_heads: int
    index_head_dim: int
    index_topk: int
    hc_mult: int
    hc_sinkhorn_iters: int
    hc_eps: float
    swiglu_limit: float
    rope_main: RopeConfig
    rope_compress: RopeConfig
    moe: MoeConfig
    num_nextn_predict_layers: int = 0

    def compress_rate(self, layer: int) -> int:
        """Tokens per compressed entry of `layer` (0 for a sliding-only layer)."""
        kind = self.layer_types[layer]
        return {"compressed_sparse_attention": self.csa_rate, "heavily_compressed_attention": self.hca_rate}.get(kind, 0)


V4_LAYER_TYPES = ("sliding_attention", "compressed_sparse_attention", "heavily_compressed_attention")
#: DeepSeek's release writes per-layer compress ratios instead of layer type names.
_V4_RATIO_LAYER_TYPES = {0: "sliding_attention", 4: "compressed_sparse_attention", 128: "heavily_compressed_attention"}


def deepseek_v4_config(raw: Mapping[str, Any], head_dim: int) -> DeepseekV4Config:
    """DeepSeek-V4's fields, with transformers' defaults and its legacy spellings
    (`compress_ratios`, `num_hash_layers`, `compress_rate_csa/hca`, flat rope params)."""
    layers = required_field(raw, "num_hidden_layers")
    rates = dict(raw.get("compress_rates") or {})
    csa = rates.get("compressed_sparse_attention", raw.get("compress_rate_csa", 4))
    hca = rates.get("heavily_compressed_attention", raw.get("compress_rate_hca", 128))
    layer_types = raw.get("layer_types")
    if layer_types is None and raw.get("compress_ratios") is not None:
        layer_types = [_V4_RATIO_LAYER_TYPES[r] for r in raw["compress_ratios"]]
    if layer_types is None:
        interleave = ["compressed_sparse_attention" if i % 2 else "heavily_compressed_attention" for i in range(layers - 2)]
        layer_types = ["heavily_compressed_attention"] * min(layers, 2) + interleave
    mlp_types = raw.get("mlp_layer_types")
    if mlp_types is None:
        hashed = min(layers, raw.get("num_hash_layers", 3))
        mlp_types = ["hash_moe"] * hashed + ["moe"] * (layers - hashed)
    for name, types, allowed in (
        ("layer_types", layer_types, V4_LAYER_TYPES), ("mlp_layer_types", mlp_types, ("hash_moe", "moe"))
    ):
        if len(types) < layers or any(t not in allowed for t in types):
            raise ModelConfigError(f"config.json: {name} must list {layers} entries from {list(allowed)}, got {types}")
    rotary_dim = raw.get("qk_rope_head_dim") or int(head_dim * (raw.get("partial_rotary_factor") or 64 / 512))
    rope_main, rope_compress = _v4_ropes(raw, rotary_dim)
    scoring = {"sqrtsoftplus": "sqrt_softplus"}.get(raw.get("scoring_func", "sqrtsoftplus"), raw.get("scoring_func"))
    moe = MoeConfig(
        num_experts=required_field(raw, "n_routed_experts"),
        top_k=required_field(raw, "num_experts_per_tok"),
        intermediate_size=required_field(raw, "moe_intermediate_size"),
        sparse_layers=frozenset(range(layers)),
        scoring=scoring,
        renormalize=True,  # V4's routers always renormalise (transformers and DeepSeek's code)
        routed_scaling_factor=float(raw.get("routed_scaling_factor", 1.5)),
        num_shared_experts=raw.get("n_shared_experts", 1),
        correction_bias=True,
    )
    return DeepseekV4Config(
        layer_types=tuple(layer_types[:layers]),
        mlp_layer_types=tuple(mlp_types[:layers]),
        csa_rate=csa,
        hca_rate=hca,
        sliding_window=raw.get("sliding_window", 128),
        q_lora_rank=required_field(raw, "q_lora_rank"),
        o_groups=raw.get("o_groups", 8),
        o_lora_rank=raw.get("o_lora_rank", 1024),
        index_n_heads=raw.get("index_n_heads", 64),
        index_head_dim=raw.get("index_head_dim", 128),
        index_topk=raw.get("index_topk", 512),
        hc_mult=raw.get("hc_mult", 4),
        hc_sinkhorn_iters=raw.get("hc_sinkhorn_iters", 20),
        hc_eps=float(raw.get("hc_eps", 1e-6)),
        swiglu_limit=float(raw.get("swiglu_limit", 10.0)),
        rope_main=rope_main,
        rope_compress=rope_compress,
        moe=moe,
        num_nextn_predict_layers=raw.get("num_nextn_predict_layers", 0),
    )


def _v4_ropes(raw: Mapping[str, Any], rotary_dim: int) -> tuple[RopeConfig, RopeConfig]:
    """(main, compress) rotary configs, gpt-j (interleaved) layout. Nested
    `rope_parameters` {main, compress} as transformers writes them, else main = plain
    `rope_theta` and compress = the scaling params at `compress_rope_theta`; a yarn
    compress rope keeps cos/sin unscaled (attention_factor 1), as DeepSeek's code does."""
    params = raw.get("rope_parameters") or raw.get("rope_scaling") or {}
    if isinstance(params.get("main"), dict) and isinstance(params.get("compress"), dict):
        main, compress = dict(params["main"]), dict(params["compress"])
    else:
        main = {"rope_type": "default", "rope_theta": raw.get("rope_theta", 10000.0)}
        compress = {k: v for k, v in params.items() if k not in ("main", "compress")}
        compress["rope_theta"] = raw.get("compress_rope_theta", 160000.0)
    if (compress.get("rope_type") or compress.get("type")) == "yarn":
        compress.setdefault("attention_factor", 1.0)
    return (
        parse_rope({"rope_parameters": main}, rotary_dim, is_neox=False),
        parse_rope({"rope_parameters": compress}, rotary_dim, is_neox=False),
    )


def parse_config(raw: Mapping[str, Any], config: ModelConfig) -> ModelConfig:
    """`config` with DeepSeek-V4's fields (`v4`) parsed from `raw`."""
    return dataclasses.replace(config, v4=deepseek_v4_config(raw, config.head_dim))
