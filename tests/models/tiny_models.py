"""Tiny random Hugging Face models of every supported architecture, built with
transformers (seeded), and the fixed prompt the model tests feed them."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

import json

import torch
import transformers
from safetensors.torch import load_file, save_file

#: DeepSeek's fp8 checkpoints: e4m3fn weights, one scale per 128x128 tile.
BLOCK = 128
E4M3_MAX = 448.0
PROMPT_LEN = 64
NEW_TOKENS = 32
VOCAB = 256
#: Weights larger than transformers' default (0.02) make logits and router scores
#: spread out, so greedy argmax and top-k routing are not decided by rounding noise.
INIT_STD = 0.1
COMMON = dict(
    hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
    vocab_size=VOCAB, max_position_embeddings=256, initializer_range=INIT_STD,
)


@dataclass(frozen=True)
class TinyArchitecture:
    """How to build one tiny random model with transformers."""

    config_class: Callable[..., Any]
    model_class: Callable[..., Any]
    fields: dict[str, Any]
    #: Randomises buffers transformers initialises to constants (DeepSeek's router bias).
    randomise: Callable[[Any], None] = lambda model: None


def _random_correction_bias(model: Any) -> None:
    for layer in model.model.layers:
        gate = getattr(layer.mlp, "gate", None)
        if gate is not None:
            gate.e_score_correction_bias.normal_(0, 0.1)


ARCHITECTURES = {
    # llama3 rope scaling with a short original context, so scaling changes the angles.
    "llama": TinyArchitecture(
        transformers.LlamaConfig, transformers.LlamaForCausalLM,
        dict(COMMON, rope_scaling=dict(rope_type="llama3", factor=8.0, low_freq_factor=1.0, high_freq_factor=4.0,
                                       original_max_position_embeddings=32)),
    ),
    # q/k/v bias, tied embeddings and linear rope scaling.
    "qwen2": TinyArchitecture(
        transformers.Qwen2Config, transformers.Qwen2ForCausalLM,
        dict(COMMON, tie_word_embeddings=True, rope_scaling=dict(rope_type="linear", factor=2.0)),
    ),
    # per-head q/k norm and yarn rope scaling.
    "qwen3": TinyArchitecture(
        transformers.Qwen3Config, transformers.Qwen3ForCausalLM,
        dict(COMMON, head_dim=16, rope_scaling=dict(rope_type="yarn", factor=4.0, original_max_position_embeddings=32)),
    ),
    "mixtral": TinyArchitecture(
        transformers.MixtralConfig, transformers.MixtralForCausalLM,
        dict(COMMON, num_local_experts=4, num_experts_per_tok=2),
    ),
    # renormalised top-k, and a dense first layer (mlp_only_layers).
    "qwen3_moe": TinyArchitecture(
        transformers.Qwen3MoeConfig, transformers.Qwen3MoeForCausalLM,
        dict(COMMON, head_dim=16, num_experts=8, num_experts_per_tok=2, moe_intermediate_size=32,
             norm_topk_prob=True, mlp_only_layers=[0]),
    ),
    # MLA with q lora, interleaved yarn rope with mscale, grouped sigmoid routing with
    # correction bias, a shared expert and a dense first layer.
    "deepseek_v3": TinyArchitecture(
        transformers.DeepseekV3Config, transformers.DeepseekV3ForCausalLM,
        dict(COMMON, num_key_value_heads=4, n_routed_experts=8, n_group=4, topk_group=2, num_experts_per_tok=2,
             moe_intermediate_size=32, first_k_dense_replace=1, q_lora_rank=32, kv_lora_rank=32,
             qk_rope_head_dim=8, qk_nope_head_dim=16, v_head_dim=16, routed_scaling_factor=2.5,
             rope_scaling=dict(rope_type="yarn", factor=4.0, original_max_position_embeddings=32, mscale=1.0,
                               mscale_all_dim=1.0, beta_fast=32, beta_slow=1)),
        randomise=_random_correction_bias,
    ),
}


def build_tiny_model(name: str, **overrides: Any) -> Any:
    """A seeded random transformers model of architecture `name` (fields overridable)."""
    spec = ARCHITECTURES[name]
    torch.manual_seed(0)
    model = spec.model_class(spec.config_class(**{**spec.fields, **overrides}))
    with torch.no_grad():
        spec.randomise(model)
    return model.eval()


def fixed_prompt() -> list[int]:
    """The fixed 64-token prompt every parity test feeds."""
    return torch.randint(0, VOCAB, (PROMPT_LEN,), generator=torch.Generator().manual_seed(1234)).tolist()


def load_transformers(directory: Path, dtype: torch.dtype) -> Any:
    """The checkpoint as transformers loads it, in `dtype`."""
    return transformers.AutoModelForCausalLM.from_pretrained(directory, dtype=dtype).eval()


def is_quantised_in_deepseek_checkpoints(name: str, tensor: torch.Tensor) -> bool:
    """Linear weights of attention and MLPs; not embeddings, head, norms or the router."""
    return (
        name.startswith("model.layers.") and name.endswith("proj.weight") and tensor.dim() == 2
        and "norm" not in name
    )


def quantise_blocks(weight: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(e4m3fn weight, weight_scale_inv) with one scale per 128x128 tile, as DeepSeek's
    conversion script writes them (written here independently of accord's quantiser)."""
    rows, cols = weight.shape
    scales = torch.empty(-(-rows // BLOCK), -(-cols // BLOCK))
    quantised = torch.empty(rows, cols, dtype=torch.float8_e4m3fn)
    for i in range(scales.shape[0]):
        for j in range(scales.shape[1]):
            tile = weight[i * BLOCK : (i + 1) * BLOCK, j * BLOCK : (j + 1) * BLOCK].float()
            scales[i, j] = tile.abs().max().clamp_min(1e-12) / E4M3_MAX
            quantised[i * BLOCK : (i + 1) * BLOCK, j * BLOCK : (j + 1) * BLOCK] = (tile / scales[i, j]).to(
                torch.float8_e4m3fn
            )
    return quantised, scales


def write_block_fp8(source: Path, directory: Path) -> Path:
    """`source`'s checkpoint with its linear weights block-quantised to fp8 in
    `directory`, config.json declaring it, as DeepSeek ships its checkpoints."""
    tensors = {}
    for name, tensor in load_file(source / "model.safetensors").items():
        if is_quantised_in_deepseek_checkpoints(name, tensor):
            tensors[name], tensors[name.replace(".weight", ".weight_scale_inv")] = quantise_blocks(tensor)
        else:
            tensors[name] = tensor
    save_file(tensors, directory / "model.safetensors", metadata={"format": "pt"})
    config = json.loads((source / "config.json").read_text())
    config["quantization_config"] = {
        "quant_method": "fp8", "fmt": "e4m3", "activation_scheme": "dynamic", "weight_block_size": [128, 128],
    }
    (directory / "config.json").write_text(json.dumps(config))
    return directory
