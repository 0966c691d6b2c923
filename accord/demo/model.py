"""The embedded demo model: a small Llama-architecture model with random weights and its
tokenizer, generated deterministically on first use and cached, so `accord serve`
works on a fresh CPU machine with no download.

The directory is an ordinary Hugging Face model directory (config.json, safetensors with
Hugging Face Llama's tensor names, tokenizer.json, tokenizer_config.json), read by the
same loader as any other model.
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile
from dataclasses import dataclass
from pathlib import Path

import torch
from safetensors.torch import save_file

from .tokenizer import BOS_TOKEN, CHAT_TEMPLATE, EOS_TOKEN, build_demo_tokenizer

#: Bump when anything generated here changes, so stale caches are never reused.
DEMO_MODEL_VERSION = 1
DEMO_MODEL_NAME = "accord-demo-random"
DEMO_MODEL_DESCRIPTION = "built-in demo model with random weights: its output is meaningless"
CACHE_DIR_ENV = "ACCORD_CACHE_DIR"
#: KV cache budget when serving the demo model without --kv-cache-memory-bytes
#: (64k tokens: plenty for a demo, and quick to allocate).
DEMO_KV_CACHE_BYTES = 256 << 20


@dataclass(frozen=True)
class DemoModelShape:
    """The demo model's dimensions (sized to load in well under a second and decode fast
    on two CPU cores)."""

    hidden_size: int = 256
    intermediate_size: int = 768
    num_hidden_layers: int = 4
    num_attention_heads: int = 8
    num_key_value_heads: int = 4
    max_position_embeddings: int = 2048
    rope_theta: float = 10000.0
    rms_norm_eps: float = 1e-5
    seed: int = 0


def cache_root() -> Path:
    """Where accord caches generated files: `$ACCORD_CACHE_DIR`, else `~/.cache/accord`."""
    configured = os.environ.get(CACHE_DIR_ENV)
    return Path(configured) if configured else Path.home() / ".cache" / "accord"


def demo_model_dir() -> Path:
    """The demo model's directory, generating it first if it is not cached yet."""
    target = cache_root() / f"{DEMO_MODEL_NAME}-v{DEMO_MODEL_VERSION}"
    if not (target / "config.json").exists():
        _write_atomically(target)
    return target


def _write_atomically(target: Path) -> None:
    # Build in a private temporary directory beside the target and rename it into
    # place: concurrent processes (test workers) each build their own copy, one rename
    # wins, and nobody ever sees a half-written directory.
    target.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=f".{target.name}-", dir=target.parent))
    try:
        write_demo_model(staging)
        try:
            staging.rename(target)
        except OSError:
            if not (target / "config.json").exists():
                raise
    finally:
        shutil.rmtree(staging, ignore_errors=True)


def write_demo_model(directory: Path, shape: DemoModelShape = DemoModelShape()) -> None:
    """Write the complete demo model (weights, tokenizer, configs, model card) into
    `directory`; the same `shape` always gives byte-identical files."""
    tokenizer = build_demo_tokenizer()
    tokenizer.save(str(directory / "tokenizer.json"))
    vocab_size = tokenizer.get_vocab_size()
    bos_id, eos_id = tokenizer.token_to_id(BOS_TOKEN), tokenizer.token_to_id(EOS_TOKEN)
    save_file(_random_weights(shape, vocab_size), str(directory / "model.safetensors"), metadata={"format": "pt"})
    _write_json(directory / "config.json", _model_config(shape, vocab_size, bos_id, eos_id))
    _write_json(directory / "generation_config.json", {"bos_token_id": bos_id, "eos_token_id": eos_id})
    _write_json(
        directory / "tokenizer_config.json",
        {
            "tokenizer_class": "PreTrainedTokenizerFast",
            "bos_token": BOS_TOKEN,
            "eos_token": EOS_TOKEN,
            "chat_template": CHAT_TEMPLATE,
            "model_max_length": shape.max_position_embeddings,
            "clean_up_tokenization_spaces": False,
        },
    )
    (directory / "README.md").write_text(_model_card(shape, vocab_size))


def _model_config(shape: DemoModelShape, vocab_size: int, bos_id: int, eos_id: int) -> dict:
    return {
        "architectures": ["LlamaForCausalLM"],
        "model_type": "llama",
        "hidden_size": shape.hidden_size,
        "intermediate_size": shape.intermediate_size,
        "num_hidden_layers": shape.num_hidden_layers,
        "num_attention_heads": shape.num_attention_heads,
        "num_key_value_heads": shape.num_key_value_heads,
        "head_dim": shape.hidden_size // shape.num_attention_heads,
        "hidden_act": "silu",
        "max_position_embeddings": shape.max_position_embeddings,
        "rms_norm_eps": shape.rms_norm_eps,
        "rope_theta": shape.rope_theta,
        "attention_bias": False,
        "mlp_bias": False,
        "tie_word_embeddings": False,
        "vocab_size": vocab_size,
        "bos_token_id": bos_id,
        "eos_token_id": eos_id,
        "torch_dtype": "float32",
    }


def _random_weights(shape: DemoModelShape, vocab_size: int) -> dict[str, torch.Tensor]:
    """Seeded Gaussian weights under Hugging Face Llama's tensor names."""
    generator = torch.Generator().manual_seed(shape.seed)
    hidden, head_dim = shape.hidden_size, shape.hidden_size // shape.num_attention_heads
    kv_width = shape.num_key_value_heads * head_dim

    def linear(out_features: int, in_features: int, gain: float = 1.0) -> torch.Tensor:
        # 1/sqrt(fan_in) keeps activations O(1) through the layers.
        return torch.randn(out_features, in_features, generator=generator) * (gain / in_features**0.5)

    weights = {"model.embed_tokens.weight": torch.randn(vocab_size, hidden, generator=generator)}
    for layer in range(shape.num_hidden_layers):
        prefix = f"model.layers.{layer}"
        weights |= {
            f"{prefix}.input_layernorm.weight": torch.ones(hidden),
            f"{prefix}.self_attn.q_proj.weight": linear(hidden, hidden),
            f"{prefix}.self_attn.k_proj.weight": linear(kv_width, hidden),
            f"{prefix}.self_attn.v_proj.weight": linear(kv_width, hidden),
            f"{prefix}.self_attn.o_proj.weight": linear(hidden, hidden),
            f"{prefix}.post_attention_layernorm.weight": torch.ones(hidden),
            f"{prefix}.mlp.gate_proj.weight": linear(shape.intermediate_size, hidden),
            f"{prefix}.mlp.up_proj.weight": linear(shape.intermediate_size, hidden),
            f"{prefix}.mlp.down_proj.weight": linear(hidden, shape.intermediate_size),
        }
    weights["model.norm.weight"] = torch.ones(hidden)
    # A gain of 3 spreads the logits (std ~3) so greedy picks win by clear margins and
    # different backends agree on them despite rounding differences.
    weights["lm_head.weight"] = linear(vocab_size, hidden, gain=3.0)
    return weights


def _model_card(shape: DemoModelShape, vocab_size: int) -> str:
    return f"""# {DEMO_MODEL_NAME} (v{DEMO_MODEL_VERSION})

**This model has random weights. Its output is meaningless.**

It is accord's built-in demo model: `accord serve` with no `--model` serves it, so the
API can be tried on any machine without downloading anything. It is generated
deterministically (seed {shape.seed}) on first use and cached here.

- architecture: LlamaForCausalLM, {shape.num_hidden_layers} layers, hidden size {shape.hidden_size},
  {shape.num_attention_heads} attention heads, {shape.num_key_value_heads} key/value heads
- tokenizer: byte-level BPE, {vocab_size} tokens, trained on a fixed in-code corpus
- context length: {shape.max_position_embeddings} tokens
"""


def _write_json(path: Path, content: dict) -> None:
    path.write_text(json.dumps(content, indent=2, sort_keys=True) + "\n")
