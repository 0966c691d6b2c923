"""The benchmark model: a random Llama of a fixed shape (152M parameters on the CPU,
TinyLlama's 1.1B shape on a GPU) with a word-level tokenizer that names every id,
written once with transformers (a bench-time dependency only)."""

from __future__ import annotations

import json
from pathlib import Path


#: The benchmark model's shape; intermediate 2816 brings the total to ~152M parameters.
MODEL_SHAPE = dict(
    hidden_size=1024,
    num_hidden_layers=12,
    num_attention_heads=16,
    num_key_value_heads=4,
    intermediate_size=2816,
    vocab_size=8192,
    max_position_embeddings=2048,
)


#: The GPU benchmark model: TinyLlama-1.1B's shape (~1.1B parameters with vocab 32000).
GPU_MODEL_SHAPE = dict(
    hidden_size=2048,
    num_hidden_layers=22,
    num_attention_heads=32,
    num_key_value_heads=4,
    intermediate_size=5632,
    vocab_size=32000,
    max_position_embeddings=2048,
)


def build_model(directory: Path, shape: dict[str, int] = MODEL_SHAPE, device: str = "cpu") -> Path:
    """Write the random benchmark Llama of `shape` and its tokenizer into `directory`
    (once); its weights are drawn on `device` (a GPU draws 1B of them in a moment)."""
    if (directory / "config.json").exists():
        return directory
    import torch
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import LlamaConfig, LlamaForCausalLM

    directory.mkdir(parents=True, exist_ok=True)
    vocab = {f"<{i}>": i for i in range(shape["vocab_size"])}
    tokenizer = Tokenizer(models.WordLevel(vocab, unk_token="<0>"))
    tokenizer.pre_tokenizer = pre_tokenizers.Whitespace()
    tokenizer.save(str(directory / "tokenizer.json"))
    config = {"tokenizer_class": "PreTrainedTokenizerFast", "bos_token": "<1>", "eos_token": "<2>", "unk_token": "<0>"}
    (directory / "tokenizer_config.json").write_text(json.dumps(config))
    torch.manual_seed(0)
    llama = LlamaConfig(bos_token_id=1, eos_token_id=2, tie_word_embeddings=False, **shape)
    with torch.device(device):
        model = LlamaForCausalLM(llama).to(torch.bfloat16)
    model.save_pretrained(directory)
    return directory
