"""Parsing config.json into ModelConfig: every spelling the supported families use."""

from __future__ import annotations

import pytest
import torch

from accord.core.model_loader.model_config import ModelConfig, ModelConfigError

BASE = dict(
    architectures=["LlamaForCausalLM"], vocab_size=100, hidden_size=64, intermediate_size=128, num_hidden_layers=4,
    num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=256,
)


def parse(**fields) -> ModelConfig:
    return ModelConfig.from_hf({**BASE, **fields})


def test_old_style_rope_theta_and_rope_scaling_are_read():
    rope = parse(rope_theta=500000.0, rope_scaling={"type": "linear", "factor": 2.0}).rope
    assert (rope.rope_type, rope.theta, rope.factor) == ("linear", 500000.0, 2.0)


def test_head_dim_defaults_to_hidden_over_heads():
    assert parse().head_dim == 16 and parse(head_dim=32).head_dim == 32


def test_eos_ids_merge_config_and_generation_config_without_duplicates():
    config = ModelConfig.from_hf({**BASE, "eos_token_id": [2, 7]}, {"eos_token_id": [7, 9]})
    assert config.eos_token_ids == (2, 7, 9)


def test_legacy_torch_dtype_field_is_read():
    assert parse(torch_dtype="bfloat16").dtype == torch.bfloat16


def test_qwen3_moe_reads_num_experts_and_its_sparse_layer_pattern():
    moe = parse(
        architectures=["Qwen3MoeForCausalLM"], num_experts=8, num_experts_per_tok=2, moe_intermediate_size=32,
        decoder_sparse_step=2, mlp_only_layers=[3], norm_topk_prob=True,
    ).moe
    assert (moe.num_experts, moe.renormalize, moe.sparse_layers) == (8, True, frozenset({1}))


def test_deepseek_routing_fields_are_read():
    config = parse(
        architectures=["DeepseekV3ForCausalLM"], n_routed_experts=16, num_experts_per_tok=4, moe_intermediate_size=32,
        n_group=4, topk_group=2, routed_scaling_factor=2.5, n_shared_experts=1, first_k_dense_replace=1,
        kv_lora_rank=32, q_lora_rank=None, qk_nope_head_dim=16, qk_rope_head_dim=8, v_head_dim=16,
    )
    moe = config.moe
    assert (moe.scoring, moe.n_group, moe.topk_group, moe.correction_bias) == ("sigmoid", 4, 2, True)
    assert moe.sparse_layers == frozenset({1, 2, 3})
    assert config.rope.rotary_dim == 8 and not config.rope.is_neox  # interleaved rope on the rope dims


def test_block_fp8_quantization_config_is_accepted():
    quant = {"quant_method": "fp8", "activation_scheme": "dynamic", "weight_block_size": [128, 128]}
    assert parse(quantization_config=quant).fp8_block == (128, 128)


@pytest.mark.parametrize("method", ["bitsandbytes", "hqq"])
def test_other_quantization_methods_are_refused_by_name(method):
    with pytest.raises(ModelConfigError, match=f"quant_method '{method}' is not supported"):
        parse(quantization_config={"quant_method": method, "bits": 4})


def test_config_without_architectures_is_refused():
    with pytest.raises(ModelConfigError, match="architectures"):
        parse(architectures=[])
