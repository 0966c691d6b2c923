"""Tiny GGUF files written by the tests with the `gguf` package's writer, the way
llama.cpp's converter writes them: llama.cpp's tensor names (from gguf's own name map),
q/k rows permuted for `llama`, matrices stored in the requested tensor type, and a
small byte-level BPE vocabulary. A helper module, not a conftest: tests import it."""

from __future__ import annotations

from pathlib import Path

import gguf
import numpy as np
import torch
import transformers

Q = gguf.GGMLQuantizationType
#: K-quants have no quantiser in gguf-py: their blocks are random bytes with small
#: finite fp16 scales, at the byte offsets ggml's block layouts give them.
K_QUANT_SCALE_OFFSETS = {Q.Q4_K: ((0, 2e-4), (2, 2e-4)), Q.Q5_K: ((0, 1e-4), (2, 1e-4)), Q.Q6_K: ((208, 3e-5),)}
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
        if data.ndim == 1 or tensor_type == Q.F32:
            writer.add_tensor(gguf_name, data)
        elif tensor_type == Q.F16:
            writer.add_tensor(gguf_name, data.astype(np.float16))
        elif tensor_type in K_QUANT_SCALE_OFFSETS:
            writer.add_tensor(gguf_name, random_k_quant_rows(data.shape, tensor_type, rng), raw_dtype=tensor_type)
        else:
            writer.add_tensor(gguf_name, gguf.quants.quantize(data, tensor_type), raw_dtype=tensor_type)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path


def llama_cpp_permute(weight: np.ndarray, heads: int) -> np.ndarray:
    """llama.cpp's converter's q/k row order for `llama` (rotary pairs interleaved)."""
    return weight.reshape(heads, 2, weight.shape[0] // heads // 2, *weight.shape[1:]).swapaxes(1, 2).reshape(weight.shape)


def random_k_quant_rows(shape: tuple[int, ...], tensor_type: Q, rng: np.random.Generator) -> np.ndarray:
    """Random K-quant blocks for a [rows, cols] matrix, as the uint8 rows GGUF stores."""
    block_size, block_bytes = gguf.GGML_QUANT_SIZES[tensor_type]
    rows, cols = shape
    blocks = rng.integers(0, 256, size=(rows, cols // block_size, block_bytes), dtype=np.uint8)
    for offset, scale in K_QUANT_SCALE_OFFSETS[tensor_type]:
        values = rng.uniform(0.5 * scale, scale, size=blocks.shape[:2]).astype(np.float16)
        blocks[:, :, offset : offset + 2] = values.view(np.uint8).reshape(*blocks.shape[:2], 2)
    return blocks.reshape(rows, -1)
