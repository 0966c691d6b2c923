"""Rotary tables for every rope scaling config.json may ask for, against transformers'
own rope initialisers (inverse frequencies and the cos/sin attention factor)."""

from __future__ import annotations

import pytest
import torch
import transformers
from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS

from accord.core.model_loader.model_config import ModelConfig, ModelConfigError
from accord.core.models.layers.rotary import attention_factor, cos_sin_cache, inverse_frequencies

SCALINGS = {
    "linear": dict(rope_type="linear", factor=4.0),
    "llama3": dict(rope_type="llama3", factor=8.0, low_freq_factor=1.0, high_freq_factor=4.0,
                   original_max_position_embeddings=64),
    "yarn": dict(rope_type="yarn", factor=4.0, original_max_position_embeddings=64),
    "yarn_mscale": dict(rope_type="yarn", factor=40.0, original_max_position_embeddings=64, mscale=1.0,
                        mscale_all_dim=0.707, beta_fast=32, beta_slow=1),
}


def llama_config(rope_scaling) -> transformers.LlamaConfig:
    return transformers.LlamaConfig(
        hidden_size=256, num_attention_heads=4, rope_scaling=rope_scaling, architectures=["LlamaForCausalLM"],
        max_position_embeddings=4096,
    )


@pytest.mark.parametrize("scaling", SCALINGS)
def test_inverse_frequencies_match_transformers(scaling):
    hf_config = llama_config(SCALINGS[scaling])
    expected, _ = ROPE_INIT_FUNCTIONS[SCALINGS[scaling]["rope_type"]](hf_config, "cpu")
    rope = ModelConfig.from_hf(hf_config.to_dict()).rope
    torch.testing.assert_close(inverse_frequencies(rope), expected, rtol=1e-6, atol=0)


@pytest.mark.parametrize("scaling", SCALINGS)
def test_attention_factor_matches_transformers(scaling):
    hf_config = llama_config(SCALINGS[scaling])
    _, expected = ROPE_INIT_FUNCTIONS[SCALINGS[scaling]["rope_type"]](hf_config, "cpu")
    assert attention_factor(ModelConfig.from_hf(hf_config.to_dict()).rope) == pytest.approx(expected, rel=1e-6)


def test_cos_sin_cache_is_cos_then_sin_of_position_times_frequency():
    rope = ModelConfig.from_hf(llama_config(None).to_dict()).rope
    table = cos_sin_cache(rope, 4096)
    angle = 3000 * (1.0 / 10000.0 ** (2 / 64))  # position 3000, second frequency (head dim 64)
    assert table.shape == (4096, 64) and table.dtype == torch.float32
    assert table[3000, 1].item() == pytest.approx(torch.tensor(angle).cos().item(), abs=1e-4)
    assert table[3000, 33].item() == pytest.approx(torch.tensor(angle).sin().item(), abs=1e-4)


def test_unsupported_rope_type_is_refused():
    raw = llama_config(None).to_dict()
    raw["rope_parameters"] = {"rope_type": "longrope", "rope_theta": 10000.0}
    with pytest.raises(ModelConfigError, match="longrope"):
        ModelConfig.from_hf(raw)
