"""A GGUF file's metadata as the Hugging Face config.json dict the model graphs are
built from, so GGUF models run through the same `ModelConfig.from_hf` as directories.

Only what the llama, qwen2 and qwen3 graphs read is mapped; anything the file asks for
that they cannot honour (MoE experts, partial rotary, per-layer head counts, an
unknown rope scaling) is refused by name rather than ignored.
"""

from __future__ import annotations

from typing import Any

import gguf

from .reader import GgufError, GgufFile

#: GGUF `general.architecture` -> the Hugging Face architecture whose graph runs it.
ARCHITECTURES = {"llama": "LlamaForCausalLM", "qwen2": "Qwen2ForCausalLM", "qwen3": "Qwen3ForCausalLM"}

#: Tensor types dequantised at load with the `gguf` package's own dequantisation: the
#: float types and every type llama.cpp's `llama-quantize` writes for its common
#: presets (Q2_K, Q3_K_M, Q4_K_S/M, Q5_K_S/M, Q6_K, Q8_0, IQ4_NL, IQ4_XS, the legacy
#: Q4_0/Q4_1/Q5_0/Q5_1), including the types it falls back to for a tensor whose rows
#: are not whole 256-wide K-quant blocks (Q5_0, Q5_1, Q8_0, IQ4_NL).
SUPPORTED_TYPES = tuple(
    gguf.GGMLQuantizationType[name]
    for name in (
        "F32", "F16", "BF16", "Q8_0", "Q4_0", "Q4_1", "Q5_0", "Q5_1",
        "Q2_K", "Q3_K", "Q4_K", "Q5_K", "Q6_K", "IQ4_NL", "IQ4_XS",
    )
)

#: The dtype a model runs in by default: the file's float type where it has one; fp32
#: for quantised files. Their weights dequantise to fp32 values (gguf's dequantisation
#: yields fp32, llama.cpp computes on fp32 activations), which bf16 would round a second
#: time to 8 significant bits; and the default model (SmolLM2-135M Q4_1) answers the
#: README's question by a margin bf16 arithmetic does not keep on every CPU kernel
#: (README, "Quick start"). `--dtype bfloat16` still asks for bf16.
_DTYPE_BY_TENSOR_TYPE = {
    gguf.GGMLQuantizationType.F32: "float32",
    gguf.GGMLQuantizationType.F16: "float16",
    gguf.GGMLQuantizationType.BF16: "bfloat16",
}

ROPE_SCALING_TYPES = ("none", "linear", "yarn")


def check_supported(file: GgufFile) -> str:
    """The Hugging Face architecture that runs `file`, or GgufError naming what is not
    supported (the architecture, an MoE, a tensor type)."""
    architecture = ARCHITECTURES.get(file.architecture)
    if architecture is None:
        raise GgufError(
            f"{file.path}: GGUF architecture {file.architecture!r} is not supported; supported: {sorted(ARCHITECTURES)}"
        )
    if file.arch("expert_count", 0):
        raise GgufError(f"{file.path}: mixture-of-experts GGUF models ({file.architecture} with experts) are not supported")
    for tensor in file.tensors():
        if tensor.tensor_type not in SUPPORTED_TYPES:
            raise GgufError(
                f"{file.path}: tensor {tensor.name} is stored as {tensor.tensor_type.name}, a GGUF tensor type accord "
                f"does not load; supported: {', '.join(t.name for t in SUPPORTED_TYPES)}"
            )
    return architecture


def hf_config(file: GgufFile) -> tuple[dict[str, Any], dict[str, Any]]:
    """(config.json, generation_config.json) dicts equivalent to the file's metadata."""
    architecture = check_supported(file)
    hidden = _int(file, "embedding_length")
    heads = _int(file, "attention.head_count")
    head_dim = _int(file, "attention.key_length", hidden // heads)
    rotary_dim = _int(file, "rope.dimension_count", head_dim)
    if rotary_dim != head_dim:
        raise GgufError(f"{file.path}: partial rotary embeddings ({rotary_dim} of {head_dim} dims) are not supported")
    if any(t.name == "rope_freqs.weight" for t in file.tensors()):
        raise GgufError(
            f"{file.path}: per-dimension rope frequency factors (rope_freqs.weight, Llama-3.1 style rope scaling) are "
            "not supported"
        )
    names = {t.name for t in file.tensors()}
    eos_ids = [file.get(f"tokenizer.ggml.{key}", None) for key in ("eos_token_id", "eot_token_id", "eom_token_id")]
    raw: dict[str, Any] = {
        "architectures": [architecture],
        "vocab_size": _int(file, "vocab_size") if file.has(f"{file.architecture}.vocab_size") else file.count(
            "tokenizer.ggml.tokens"
        ),
        "hidden_size": hidden,
        "intermediate_size": _int(file, "feed_forward_length"),
        "num_hidden_layers": _int(file, "block_count"),
        "num_attention_heads": heads,
        "num_key_value_heads": _int(file, "attention.head_count_kv", heads),
        "head_dim": head_dim,
        "rms_norm_eps": float(file.arch("attention.layer_norm_rms_epsilon", 1e-6)),
        "max_position_embeddings": _int(file, "context_length"),
        "rope_theta": float(file.arch("rope.freq_base", 10000.0)),
        "rope_scaling": _rope_scaling(file),
        "tie_word_embeddings": "output.weight" not in names,
        "attention_bias": "blk.0.attn_q.bias" in names,
        "bos_token_id": file.get("tokenizer.ggml.bos_token_id", None),
        "eos_token_id": [i for i in eos_ids if i is not None],
        "dtype": _dtype(file),
    }
    return raw, {}


def _int(file: GgufFile, key: str, *default: int) -> int:
    value = file.arch(key, *default)
    if isinstance(value, list):
        raise GgufError(f"{file.path}: per-layer values of {file.architecture}.{key} are not supported")
    return int(value)


def _rope_scaling(file: GgufFile) -> dict[str, Any] | None:
    kind = file.arch("rope.scaling.type", "none")
    if kind not in ROPE_SCALING_TYPES:
        raise GgufError(f"{file.path}: rope scaling {kind!r} is not supported; supported: {list(ROPE_SCALING_TYPES)}")
    if kind == "none":
        return None
    scaling: dict[str, Any] = {"rope_type": kind, "factor": float(file.arch("rope.scaling.factor"))}
    if kind == "yarn":
        scaling["original_max_position_embeddings"] = _int(file, "rope.scaling.original_context_length")
    return scaling


def _dtype(file: GgufFile) -> str:
    # The type most of the 2-D weights are stored in decides.
    matrices = [t.tensor_type for t in file.tensors() if len(t.shape) == 2]
    common = max(set(matrices), key=matrices.count) if matrices else gguf.GGMLQuantizationType.F32
    return _DTYPE_BY_TENSOR_TYPE.get(common, "float32")
