"""A Hugging Face Llama directory (config.json, safetensors, tokenizer.json) written as
a GGUF file llama.cpp runs, so llama.cpp's tools measure the very weights accord and
vLLM load. llama.cpp's own converter (convert_hf_to_gguf.py) names a BPE tokenizer by
a hash of how it splits a fixed text and refuses one it has not listed; the
benchmarks' tokenizers are made here (the demo's trained BPE, the bench model's
word-level one), so none is.

Written with gguf-py's writer the way that converter writes a Llama: llama.cpp's tensor
names (gguf's own name map), the q/k rows permuted to llama.cpp's rotary order, norms
in f32 and matrices in the type asked for; the vocabulary as a GPT-2-style BPE
(`tokenizer.ggml.model = gpt2`: the tokens and merges of a BPE tokenizer.json, or a
word-level one's tokens with no merges; llama.cpp then detokenises every id, while
text it tokenises loses what no token spells, which token-id prompts never meet)."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Literal

import gguf
import numpy as np
import torch
from safetensors import safe_open

#: The tensor types a matrix may be written in (norms stay f32, as llama.cpp's converter writes them).
GGUFTensorType = Literal["f32", "f16", "bf16"]
_QUANT_TYPES = {"f32": gguf.GGMLQuantizationType.F32, "f16": gguf.GGMLQuantizationType.F16,
                "bf16": gguf.GGMLQuantizationType.BF16}  # fmt: skip
_FILE_TYPES = {"f32": gguf.LlamaFileType.ALL_F32, "f16": gguf.LlamaFileType.MOSTLY_F16,
               "bf16": gguf.LlamaFileType.MOSTLY_BF16}  # fmt: skip


def export_gguf(model_dir: Path, path: Path, tensor_type: GGUFTensorType = "bf16") -> Path:
    """Write the Llama in `model_dir` to `path` (once: an existing file is kept) with
    matrices in `tensor_type`; returns `path`. ValueError for a model that is no Llama."""
    if path.exists():
        return path
    config = json.loads((model_dir / "config.json").read_text())
    if config.get("model_type") != "llama":
        raise ValueError(f"{model_dir}: GGUF export writes Llama models only, this one is {config.get('model_type')!r}")
    layers, heads = config["num_hidden_layers"], config["num_attention_heads"]
    kv_heads = config.get("num_key_value_heads", heads)
    head_dim = config.get("head_dim") or config["hidden_size"] // heads
    partial = path.with_name(path.name + ".partial")
    writer = gguf.GGUFWriter(str(partial), "llama")
    writer.add_name(model_dir.name)
    writer.add_file_type(_FILE_TYPES[tensor_type])
    writer.add_block_count(layers)
    writer.add_context_length(config["max_position_embeddings"])
    writer.add_embedding_length(config["hidden_size"])
    writer.add_feed_forward_length(config["intermediate_size"])
    writer.add_head_count(heads)
    writer.add_head_count_kv(kv_heads)
    writer.add_key_length(head_dim)
    writer.add_value_length(head_dim)
    writer.add_rope_dimension_count(head_dim)
    writer.add_rope_freq_base(config.get("rope_theta", 10000.0))
    writer.add_layer_norm_rms_eps(config["rms_norm_eps"])
    writer.add_vocab_size(config["vocab_size"])
    _add_vocabulary(writer, model_dir, config)
    names = gguf.get_tensor_name_map(gguf.MODEL_ARCH.LLAMA, layers)
    for name, tensor in _safetensors(model_dir):
        if name == "lm_head.weight" and config.get("tie_word_embeddings"):
            continue
        data = tensor.float().numpy()
        if name.endswith(("q_proj.weight", "k_proj.weight")):
            data = _rotary_rows_interleaved(data, heads if "q_proj" in name else kv_heads)
        kind = "f32" if data.ndim == 1 else tensor_type
        stored = data if kind == "f32" else gguf.quants.quantize(data, _QUANT_TYPES[kind])
        writer.add_tensor(names.get_name(name, try_suffixes=(".weight",)), stored, raw_dtype=_QUANT_TYPES[kind])
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    partial.rename(path)
    return path


def _safetensors(model_dir: Path) -> Iterator[tuple[str, torch.Tensor]]:
    for file in sorted(model_dir.glob("*.safetensors")):
        with safe_open(str(file), framework="pt") as tensors:
            for name in tensors.keys():
                yield name, tensors.get_tensor(name)


def _rotary_rows_interleaved(weight: np.ndarray, heads: int) -> np.ndarray:
    """llama.cpp's q/k row order for Llama: each head's rotary halves interleaved
    (convert_hf_to_gguf.py's LlamaModel.permute)."""
    return weight.reshape(heads, 2, weight.shape[0] // heads // 2, *weight.shape[1:]).swapaxes(1, 2).reshape(weight.shape)


def _add_vocabulary(writer: gguf.GGUFWriter, model_dir: Path, config: dict) -> None:
    """The tokenizer.json's tokens (padded with unused ones to the model's vocabulary),
    its merges when it is a BPE, its special tokens as control tokens, BOS/EOS and
    chat template."""
    spec = json.loads((model_dir / "tokenizer.json").read_text())
    model = spec["model"]
    if model["type"] not in ("BPE", "WordLevel"):
        raise ValueError(f"{model_dir}: GGUF export reads BPE or word-level tokenizers, not {model['type']}")
    by_id = {index: token for token, index in model["vocab"].items()}
    specials = {added["id"]: added["content"] for added in spec.get("added_tokens", []) if added.get("special")}
    by_id |= {added["id"]: added["content"] for added in spec.get("added_tokens", [])}
    tokens = [by_id.get(index, f"[PAD{index}]") for index in range(config["vocab_size"])]
    types = [
        gguf.TokenType.CONTROL if index in specials else
        gguf.TokenType.NORMAL if index in by_id else gguf.TokenType.UNUSED
        for index in range(config["vocab_size"])
    ]  # fmt: skip
    merges = [m if isinstance(m, str) else " ".join(m) for m in model.get("merges", [])]
    writer.add_tokenizer_model("gpt2")
    writer.add_tokenizer_pre("default")
    writer.add_token_list(tokens)
    writer.add_token_types(types)
    # llama.cpp's gpt2 vocabulary requires the merges key; a word-level one has none
    # to give, and a merge of two tokens no text splits into changes nothing.
    writer.add_token_merges(merges or [f"{tokens[0]} {tokens[0]}"])
    for key, add in (("bos_token_id", writer.add_bos_token_id), ("eos_token_id", writer.add_eos_token_id)):
        if isinstance(config.get(key), int):
            add(config[key])
    writer.add_add_bos_token(False)  # prompts go as token ids, exactly as the other engines get them
    tokenizer_config = model_dir / "tokenizer_config.json"
    template = json.loads(tokenizer_config.read_text()).get("chat_template") if tokenizer_config.exists() else None
    if isinstance(template, str):
        writer.add_chat_template(template)
