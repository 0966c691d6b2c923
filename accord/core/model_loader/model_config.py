"""A Hugging Face config.json, parsed once into typed dataclasses the model graphs read.

Every architecture-specific spelling (Mixtral's `num_local_experts`, Qwen3-MoE's
`num_experts`, DeepSeek's `n_routed_experts`, the old `rope_scaling` against the new
`rope_parameters`) is resolved here, so the graphs see one vocabulary. A family with
fields of its own parses them beside its graph (`parse_config` in its module; the
registry's `parse_model_config` applies it).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Mapping

import torch

from .group_quant.scheme import GroupQuantScheme, QuantizationConfigError, group_quant_scheme

if TYPE_CHECKING:
    from ..models.deepseek_v4.config import DeepseekV4Config

DTYPES_BY_NAME = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}
ROPE_TYPES = ("default", "linear", "llama3", "yarn")


class ModelConfigError(ValueError):
    """A config.json this engine cannot run; the message names the field."""


@dataclass(frozen=True)
class RopeConfig:
    """Rotary embedding parameters: base, rotated dims and the scaling the config asks for
    (`default`, `linear`, `llama3` or `yarn`, with their keys as Hugging Face names them)."""

    rope_type: str
    theta: float
    rotary_dim: int
    is_neox: bool = True
    factor: float = 1.0
    low_freq_factor: float = 1.0
    high_freq_factor: float = 4.0
    original_max_position_embeddings: int | None = None
    beta_fast: float = 32.0
    beta_slow: float = 1.0
    mscale: float | None = None
    mscale_all_dim: float | None = None
    attention_factor: float | None = None
    truncate: bool = True


@dataclass(frozen=True)
class MoeConfig:
    """Routed experts: how many, how a token picks them, and which layers have them."""

    num_experts: int
    top_k: int
    intermediate_size: int
    sparse_layers: frozenset[int]
    scoring: str = "softmax"
    renormalize: bool = False
    n_group: int = 1
    topk_group: int = 1
    routed_scaling_factor: float = 1.0
    num_shared_experts: int = 0
    correction_bias: bool = False


@dataclass(frozen=True)
class MlaConfig:
    """Multi-head latent attention dimensions (DeepSeek-V2/V3)."""

    q_lora_rank: int | None
    kv_lora_rank: int
    qk_nope_head_dim: int
    qk_rope_head_dim: int
    v_head_dim: int


@dataclass(frozen=True)
class ModelConfig:
    """What a model graph needs from config.json, typed. `dtype` is the dtype the model
    runs in once load_model has resolved it; `fp8_block` is the checkpoint's weight
    block shape when it stores DeepSeek-style block-quantised fp8 weights."""

    architecture: str
    vocab_size: int
    hidden_size: int
    intermediate_size: int
    num_layers: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    rms_norm_eps: float
    max_position_embeddings: int
    eos_token_ids: tuple[int, ...]
    bos_token_id: int | None
    dtype: torch.dtype
    rope: RopeConfig
    tie_word_embeddings: bool = False
    attention_bias: bool = False
    qk_norm: bool = False
    sliding_windows: tuple[int, ...] = ()
    moe: MoeConfig | None = None
    mla: MlaConfig | None = None
    fp8_block: tuple[int, int] | None = None
    #: How the checkpoint stores int4/int8 group-quantised linears (AWQ, GPTQ,
    #: compressed-tensors), when it does: they load packed, for group_quant_linear.
    group_quant: GroupQuantScheme | None = None
    #: DeepSeek-V4's own fields, parsed beside its graph (models/deepseek_v4/config.py).
    v4: DeepseekV4Config | None = None
    #: Multi-token-prediction layers the checkpoint carries past num_layers (DeepSeek).
    num_nextn_predict_layers: int = 0

    @classmethod
    def from_hf(cls, raw: Mapping[str, Any], generation: Mapping[str, Any] | None = None) -> ModelConfig:
        """Parse a config.json dict; generation_config.json's dict adds its eos ids."""
        architecture = _architecture(raw)
        num_heads = required_field(raw, "num_attention_heads")
        hidden_size = required_field(raw, "hidden_size")
        num_layers = required_field(raw, "num_hidden_layers")
        mla = _mla(raw) if architecture == "DeepseekV3ForCausalLM" else None
        head_dim = raw.get("head_dim") or hidden_size // num_heads
        rotary_dim = mla.qk_rope_head_dim if mla else head_dim
        return cls(
            architecture=architecture,
            vocab_size=required_field(raw, "vocab_size"),
            hidden_size=hidden_size,
            intermediate_size=raw.get("intermediate_size") or required_field(raw, "moe_intermediate_size"),
            num_layers=num_layers,
            num_heads=num_heads,
            num_kv_heads=raw.get("num_key_value_heads") or num_heads,
            head_dim=head_dim,
            rms_norm_eps=float(raw.get("rms_norm_eps", 1e-6)),
            max_position_embeddings=required_field(raw, "max_position_embeddings"),
            eos_token_ids=_merge_ids(raw.get("eos_token_id"), (generation or {}).get("eos_token_id")),
            bos_token_id=raw.get("bos_token_id"),
            dtype=checkpoint_dtype(raw),
            rope=parse_rope(raw, rotary_dim, is_neox=not (mla and raw.get("rope_interleave", True))),
            tie_word_embeddings=bool(raw.get("tie_word_embeddings", False)),
            attention_bias=bool(raw.get("attention_bias", architecture == "Qwen2ForCausalLM")),
            qk_norm=architecture in ("Qwen3ForCausalLM", "Qwen3MoeForCausalLM"),
            num_nextn_predict_layers=int(raw.get("num_nextn_predict_layers") or 0),
            sliding_windows=_sliding_windows(raw, architecture, num_layers),
            moe=_moe(raw, architecture, num_layers),
            mla=mla,
            fp8_block=_fp8_block(raw),
            group_quant=_group_quant(raw),
        )


def checkpoint_dtype(raw: Mapping[str, Any]) -> torch.dtype:
    """The dtype config.json declares (`dtype`, or the older `torch_dtype`); fp32 if none."""
    name = raw.get("dtype") or raw.get("torch_dtype") or "float32"
    if name not in DTYPES_BY_NAME:
        raise ModelConfigError(f"config.json: dtype {name!r} is not one of {sorted(DTYPES_BY_NAME)}")
    return DTYPES_BY_NAME[name]


def _architecture(raw: Mapping[str, Any]) -> str:
    architectures = raw.get("architectures") or []
    if not architectures:
        raise ModelConfigError("config.json has no 'architectures' entry; cannot tell which graph to build")
    return architectures[0]


def required_field(raw: Mapping[str, Any], key: str) -> Any:
    if raw.get(key) is None:
        raise ModelConfigError(f"config.json: required field {key!r} is missing")
    return raw[key]


def _merge_ids(*sources: Any) -> tuple[int, ...]:
    ids: list[int] = []
    for source in sources:
        for token in [source] if isinstance(source, int) else source or ():
            if token not in ids:
                ids.append(token)
    return tuple(ids)


def parse_rope(raw: Mapping[str, Any], rotary_dim: int, is_neox: bool) -> RopeConfig:
    # transformers 5 writes `rope_parameters` (theta inside); older files write
    # `rope_theta` beside a `rope_scaling` dict keyed by `type` or `rope_type`.
    params = dict(raw.get("rope_parameters") or raw.get("rope_scaling") or {})
    rope_type = params.get("rope_type") or params.get("type") or "default"
    if rope_type not in ROPE_TYPES:
        raise ModelConfigError(f"config.json: rope type {rope_type!r} is not supported; supported: {list(ROPE_TYPES)}")
    optional = {
        key: params[key]
        for key in (
            "factor", "low_freq_factor", "high_freq_factor", "original_max_position_embeddings", "beta_fast",
            "beta_slow", "mscale", "mscale_all_dim", "attention_factor", "truncate",
        )
        if params.get(key) is not None
    }
    theta = params.get("rope_theta") or raw.get("rope_theta") or 10000.0
    return RopeConfig(rope_type=rope_type, theta=float(theta), rotary_dim=rotary_dim, is_neox=is_neox, **optional)


def _sliding_windows(raw: Mapping[str, Any], architecture: str, num_layers: int) -> tuple[int, ...]:
    window = raw.get("sliding_window") or 0
    layer_types = raw.get("layer_types")
    if layer_types:
        return tuple(window if kind == "sliding_attention" else 0 for kind in layer_types)
    if architecture == "MixtralForCausalLM" or raw.get("use_sliding_window"):
        return (window,) * num_layers
    return (0,) * num_layers


def _moe(raw: Mapping[str, Any], architecture: str, num_layers: int) -> MoeConfig | None:
    top_k = raw.get("num_experts_per_tok")
    if architecture == "MixtralForCausalLM":
        return MoeConfig(
            num_experts=required_field(raw, "num_local_experts"),
            top_k=top_k,
            intermediate_size=required_field(raw, "intermediate_size"),
            sparse_layers=frozenset(range(num_layers)),
            renormalize=True,
        )
    if architecture == "Qwen3MoeForCausalLM":
        num_experts = raw.get("num_experts") or required_field(raw, "num_local_experts")
        step, dense = raw.get("decoder_sparse_step", 1), set(raw.get("mlp_only_layers") or ())
        sparse = {i for i in range(num_layers) if i not in dense and num_experts > 0 and (i + 1) % step == 0}
        return MoeConfig(
            num_experts=num_experts,
            top_k=top_k,
            intermediate_size=required_field(raw, "moe_intermediate_size"),
            sparse_layers=frozenset(sparse),
            renormalize=bool(raw.get("norm_topk_prob", False)),
        )
    if architecture == "DeepseekV3ForCausalLM":
        first_dense = raw.get("first_k_dense_replace", 0)
        return MoeConfig(
            num_experts=required_field(raw, "n_routed_experts"),
            top_k=top_k,
            intermediate_size=required_field(raw, "moe_intermediate_size"),
            sparse_layers=frozenset(range(first_dense, num_layers)),
            scoring=raw.get("scoring_func", "sigmoid"),
            renormalize=bool(raw.get("norm_topk_prob", True)),
            n_group=raw.get("n_group") or 1,
            topk_group=raw.get("topk_group") or 1,
            routed_scaling_factor=float(raw.get("routed_scaling_factor", 1.0)),
            num_shared_experts=raw.get("n_shared_experts") or 0,
            correction_bias=raw.get("topk_method", "noaux_tc") == "noaux_tc",
        )
    return None


def _mla(raw: Mapping[str, Any]) -> MlaConfig:
    return MlaConfig(
        q_lora_rank=raw.get("q_lora_rank"),
        kv_lora_rank=required_field(raw, "kv_lora_rank"),
        qk_nope_head_dim=required_field(raw, "qk_nope_head_dim"),
        qk_rope_head_dim=required_field(raw, "qk_rope_head_dim"),
        v_head_dim=required_field(raw, "v_head_dim"),
    )


def _fp8_block(raw: Mapping[str, Any]) -> tuple[int, int] | None:
    # Every other method is read, or refused by name, by _group_quant.
    quant = raw.get("quantization_config")
    if not quant or quant.get("quant_method") != "fp8":
        return None
    block = quant.get("weight_block_size")
    if block is None:
        raise ModelConfigError(
            f"config.json: quantization_config {dict(quant)} is not supported; only DeepSeek-style block fp8 "
            "(quant_method 'fp8' with weight_block_size [128, 128]) is"
        )
    if list(block) != [128, 128]:
        raise ModelConfigError(f"config.json: fp8 weight_block_size {list(block)} is not supported; only [128, 128] is")
    if quant.get("activation_scheme", "dynamic") != "dynamic":
        raise ModelConfigError("config.json: only dynamic fp8 activation scales are supported")
    return (128, 128)


def _group_quant(raw: Mapping[str, Any]) -> GroupQuantScheme | None:
    try:
        return group_quant_scheme(raw.get("quantization_config"))
    except QuantizationConfigError as error:
        raise ModelConfigError(str(error)) from None
