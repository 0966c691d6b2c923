"""DeepSeek-V4's config.json: transformers' spelling and the release's legacy one parse to
the same schedules; bad schedules are refused naming the field; MTP tensors are skipped."""

from __future__ import annotations

import pytest

from accord.core.model_loader.model_config import ModelConfig, ModelConfigError
from accord.core.models.registry import parse_model_config
from accord.core.models.deepseek_v4 import is_unused_tensor

BASE = {
    "architectures": ["DeepseekV4ForCausalLM"], "vocab_size": 128, "hidden_size": 64, "num_hidden_layers": 4,
    "num_attention_heads": 4, "num_key_value_heads": 1, "head_dim": 32, "q_lora_rank": 32,
    "max_position_embeddings": 512, "moe_intermediate_size": 32, "n_routed_experts": 8, "num_experts_per_tok": 2,
    "qk_rope_head_dim": 8,
}


def parse(**fields) -> ModelConfig:
    return parse_model_config({**BASE, **fields})


def test_legacy_ratios_and_hash_layer_count_give_the_named_schedules() -> None:
    legacy = parse(compress_ratios=[0, 4, 128, 4], num_hash_layers=2, rope_theta=10000.0, compress_rope_theta=160000.0)
    named = parse(
        layer_types=["sliding_attention", "compressed_sparse_attention", "heavily_compressed_attention",
                     "compressed_sparse_attention"],
        mlp_layer_types=["hash_moe", "hash_moe", "moe", "moe"],
    )
    assert legacy.v4 is not None and named.v4 is not None
    assert legacy.v4.layer_types == named.v4.layer_types
    assert legacy.v4.mlp_layer_types == named.v4.mlp_layer_types
    assert [legacy.v4.compress_rate(i) for i in range(4)] == [0, 4, 128, 4]


def test_scoring_and_renormalisation_are_v4s_whatever_norm_topk_prob_says() -> None:
    v4 = parse(scoring_func="sqrtsoftplus", norm_topk_prob=False).v4
    assert v4 is not None and v4.moe.scoring == "sqrt_softplus" and v4.moe.renormalize


def test_flat_yarn_scaling_goes_to_the_compress_rope_only_and_keeps_cos_sin_unscaled() -> None:
    v4 = parse(
        rope_theta=10000.0, compress_rope_theta=160000.0,
        rope_scaling={"type": "yarn", "factor": 16, "original_max_position_embeddings": 65536},
    ).v4
    assert v4 is not None
    assert v4.rope_main.rope_type == "default" and v4.rope_main.theta == 10000.0
    assert v4.rope_compress.rope_type == "yarn" and v4.rope_compress.theta == 160000.0
    assert v4.rope_compress.attention_factor == 1.0
    assert not v4.rope_main.is_neox and v4.rope_main.rotary_dim == 8


def test_an_unknown_layer_type_is_refused_naming_the_field() -> None:
    with pytest.raises(ModelConfigError, match="layer_types"):
        parse(layer_types=["sliding_attention", "full_attention", "sliding_attention", "sliding_attention"])


@pytest.mark.parametrize(
    ("name", "unused"),
    [
        ("mtp.0.attn.wq_a.weight", True),
        ("model.mtp.0.ffn.gate.tid2eid", True),
        ("layers.4.attn.wkv.weight", True),
        ("layers.3.attn.wkv.weight", False),
        ("model.layers.0.ffn.gate.tid2eid", False),
        ("head.weight", False),
    ],
)
def test_mtp_layers_are_left_unread(name: str, unused: bool) -> None:
    assert is_unused_tensor(name, parse()) is unused
