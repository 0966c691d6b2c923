"""Tiny GGUF files written by the tests with the `gguf` package's writer, the way
llama.cpp's converter writes them: llama.cpp's tensor names (from gguf's own name map),
q/k rows permuted for `llama`, matrices stored in the requested tensor type, and a
small byte-level BPE vocabulary. A helper module, not a conftest: tests import it."""

from __future__ import annotations

import functools
from pathlib import Path

import gguf
import numpy as np
import pytest
import torch
import transformers

Q = gguf.GGMLQuantizationType
#: Types gguf-py cannot quantise (K-quants, i-quants): their blocks are random bytes with
#: small finite fp16 scales (byte offset, largest scale) where ggml's block layouts
#: (ggml-common.h) put them, sized so that weights stay within about +-0.2.
RANDOM_BLOCK_SCALES = {
    Q.Q2_K: ((80, 2e-3), (82, 2e-3)),  # scales[16], qs[64], d, dmin
    Q.Q3_K: ((108, 1e-3),),  # hmask[32], qs[64], scales[12], d
    Q.Q4_K: ((0, 2e-4), (2, 2e-4)),  # d, dmin, scales[12], qs[128]
    Q.Q5_K: ((0, 1e-4), (2, 1e-4)),  # d, dmin, scales[12], qh[32], qs[128]
    Q.Q6_K: ((208, 3e-5),),  # ql[128], qh[64], scales[16], d
    Q.IQ4_NL: ((0, 1e-3),),  # d, qs[16]
    Q.IQ4_XS: ((0, 3e-5),),  # d, scales_h, scales_l[4], qs[128]
}
GGUF_ARCH = {"llama": gguf.MODEL_ARCH.LLAMA, "qwen2": gguf.MODEL_ARCH.QWEN2, "qwen3": gguf.MODEL_ARCH.QWEN3}
#: Multiples of 256 everywhere, so every matrix row holds whole K-quant blocks.
SHAPE = dict(hidden_size=256, intermediate_size=512, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
             max_position_embeddings=256, rms_norm_eps=1e-6, rope_theta=10000.0)
MODEL_CLASSES = {
    "llama": (transformers.LlamaConfig, transformers.LlamaForCausalLM, {}),
    "qwen2": (transformers.Qwen2Config, transformers.Qwen2ForCausalLM, {"tie_word_embeddings": True}),
    "qwen3": (transformers.Qwen3Config, transformers.Qwen3ForCausalLM, {"head_dim": 128}),
}
SPECIALS = ("<|endoftext|>", "<|im_start|>", "<|im_end|>")
MERGES = ("Ġ t", "h e", "Ġt he")
CHAT_TEMPLATE = (
    "{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)


def byte_level_vocab() -> list[str]:
    """GPT-2's 256 byte characters, the merged tokens of MERGES, then the specials."""
    printable = [*range(ord("!"), ord("~") + 1), *range(ord("¡"), ord("¬") + 1), *range(ord("®"), ord("ÿ") + 1)]
    extra = iter(range(256, 512))
    alphabet = [chr(b) if b in printable else chr(next(extra)) for b in range(256)]
    return alphabet + ["".join(m.split()) for m in MERGES] + list(SPECIALS)


def build_model(arch: str, seed: int = 0) -> transformers.PreTrainedModel:
    """A seeded random transformers model of `arch` in fp32, norms randomised too."""
    config_class, model_class, extra = MODEL_CLASSES[arch]
    vocab = len(byte_level_vocab())
    config = config_class(vocab_size=vocab, bos_token_id=vocab - 2, eos_token_id=vocab - 1, initializer_range=0.1,
                          **SHAPE, **extra)
    torch.manual_seed(seed)
    model = model_class(config).eval()
    with torch.no_grad():
        for name, param in model.named_parameters():
            if "norm" in name:
                param.normal_(1.0, 0.1)
            elif name.endswith(".bias"):
                param.normal_(0.0, 0.1)
    return model


def write_gguf(
    path: Path, model: transformers.PreTrainedModel, arch: str, tensor_type: Q = Q.F32, architecture: str | None = None,
    tokenizer_model: str = "gpt2", pre: str = "default", seed: int = 0,
) -> Path:
    """Write `model` as llama.cpp would, matrices in `tensor_type`. `architecture`
    overrides general.architecture (to write files accord must refuse)."""
    config = model.config
    heads, kv_heads = config.num_attention_heads, config.num_key_value_heads
    head_dim = getattr(config, "head_dim", None) or config.hidden_size // heads
    writer = gguf.GGUFWriter(str(path), architecture or arch)
    writer.add_block_count(config.num_hidden_layers)
    writer.add_context_length(config.max_position_embeddings)
    writer.add_embedding_length(config.hidden_size)
    writer.add_feed_forward_length(config.intermediate_size)
    writer.add_head_count(heads)
    writer.add_head_count_kv(kv_heads)
    writer.add_key_length(head_dim)
    writer.add_value_length(head_dim)
    writer.add_rope_dimension_count(head_dim)
    writer.add_rope_freq_base(config.rope_theta if hasattr(config, "rope_theta") else SHAPE["rope_theta"])
    writer.add_layer_norm_rms_eps(config.rms_norm_eps)
    writer.add_vocab_size(config.vocab_size)
    vocab = byte_level_vocab()
    writer.add_tokenizer_model(tokenizer_model)
    writer.add_tokenizer_pre(pre)
    writer.add_token_list(vocab)
    writer.add_token_types([gguf.TokenType.CONTROL if t in SPECIALS else gguf.TokenType.NORMAL for t in vocab])
    writer.add_token_merges(list(MERGES))
    writer.add_bos_token_id(vocab.index("<|im_start|>"))
    writer.add_eos_token_id(vocab.index("<|im_end|>"))
    writer.add_chat_template(CHAT_TEMPLATE)
    names = gguf.get_tensor_name_map(GGUF_ARCH[arch], config.num_hidden_layers)
    rng = np.random.default_rng(seed)
    for name, tensor in model.state_dict().items():
        if name == "lm_head.weight" and config.tie_word_embeddings:
            continue
        data = tensor.float().numpy()
        if arch == "llama" and name.endswith(("q_proj.weight", "k_proj.weight")):
            data = llama_cpp_permute(data, heads if "q_proj" in name else kv_heads)
        gguf_name = names.get_name(name, try_suffixes=(".weight", ".bias"))
        add_matrix(writer, gguf_name, data, Q.F32 if data.ndim == 1 else tensor_type, rng)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path


def llama_cpp_permute(weight: np.ndarray, heads: int) -> np.ndarray:
    """llama.cpp's converter's q/k row order for `llama` (rotary pairs interleaved)."""
    return weight.reshape(heads, 2, weight.shape[0] // heads // 2, *weight.shape[1:]).swapaxes(1, 2).reshape(weight.shape)


def add_matrix(writer: gguf.GGUFWriter, name: str, data: np.ndarray, tensor_type: Q, rng: np.random.Generator) -> None:
    """Add `data` to `writer` stored as `tensor_type`: converted or quantised by gguf-py
    where it can, else random blocks of that type (RANDOM_BLOCK_SCALES)."""
    if tensor_type == Q.F32:
        writer.add_tensor(name, data)
    elif tensor_type == Q.F16:
        writer.add_tensor(name, data.astype(np.float16))
    elif tensor_type in RANDOM_BLOCK_SCALES:
        writer.add_tensor(name, random_block_rows(data.shape, tensor_type, rng), raw_dtype=tensor_type)
    else:
        writer.add_tensor(name, gguf.quants.quantize(data, tensor_type), raw_dtype=tensor_type)


def random_block_rows(shape: tuple[int, ...], tensor_type: Q, rng: np.random.Generator) -> np.ndarray:
    """Random blocks of `tensor_type` for a [rows, cols] matrix, as the uint8 rows GGUF
    stores, with finite scales."""
    block_size, block_bytes = gguf.GGML_QUANT_SIZES[tensor_type]
    rows, cols = shape
    blocks = rng.integers(0, 256, size=(rows, cols // block_size, block_bytes), dtype=np.uint8)
    for offset, scale in RANDOM_BLOCK_SCALES[tensor_type]:
        values = rng.uniform(0.5 * scale, scale, size=blocks.shape[:2]).astype(np.float16)
        blocks[:, :, offset : offset + 2] = values.view(np.uint8).reshape(*blocks.shape[:2], 2)
    return blocks.reshape(rows, -1)


def transformers_from_gguf(path: Path) -> torch.nn.Module:
    """transformers' own GGUF loader, in fp32 and in eval mode. gguf-py's tensor-name map is
    built once for the load: transformers builds the same read-only map again for every
    submodule (397 times for SmolLM2, most of a minute on a loaded 2-core host)."""
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(gguf, "get_tensor_name_map", functools.cache(gguf.get_tensor_name_map))
        model = transformers.AutoModelForCausalLM.from_pretrained(path.parent, gguf_file=path.name, dtype=torch.float32)
    return model.eval()
