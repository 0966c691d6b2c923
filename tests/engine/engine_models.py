"""Tiny random fp32 models (dense Llama and DeepSeek-V3) written by transformers, with
the demo byte-level BPE tokenizer, and transformers' greedy decoding as the independent
reference. A uniquely named module, so tests import it whatever else pytest collected."""

from __future__ import annotations

import json
from pathlib import Path

import torch

from accord.demo.tokenizer import BOS_TOKEN, CHAT_TEMPLATE, EOS_TOKEN, build_demo_tokenizer

MAX_POSITIONS = 1024


def write_tokenizer(directory: Path) -> tuple[int, int, int]:
    """Write tokenizer files; returns (vocab size, bos id, eos id)."""
    tokenizer = build_demo_tokenizer()
    tokenizer.save(str(directory / "tokenizer.json"))
    config = {
        "tokenizer_class": "PreTrainedTokenizerFast",
        "bos_token": BOS_TOKEN,
        "eos_token": EOS_TOKEN,
        "chat_template": CHAT_TEMPLATE,
    }
    (directory / "tokenizer_config.json").write_text(json.dumps(config))
    return tokenizer.get_vocab_size(), tokenizer.token_to_id(BOS_TOKEN), tokenizer.token_to_id(EOS_TOKEN)


def build_model_dir(directory: Path, architecture: str, dtype: torch.dtype = torch.float32) -> Path:
    """A random model of `architecture` ("llama" or "deepseek_v3") saved in `dtype` as a
    Hugging Face directory. Weights are large enough that greedy choices are not
    near-ties, so independent fp32 implementations agree on every token."""
    from transformers import DeepseekV3Config, DeepseekV3ForCausalLM, LlamaConfig, LlamaForCausalLM

    directory.mkdir(parents=True)
    vocab_size, bos_id, eos_id = write_tokenizer(directory)
    common = dict(
        vocab_size=vocab_size,
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=4,
        max_position_embeddings=MAX_POSITIONS,
        bos_token_id=bos_id,
        eos_token_id=eos_id,
        initializer_range=0.2,
        tie_word_embeddings=False,
    )
    if architecture == "llama":
        config = LlamaConfig(num_key_value_heads=2, **common)
        model_class = LlamaForCausalLM
    else:
        config = DeepseekV3Config(
            num_key_value_heads=4,
            moe_intermediate_size=32,
            n_routed_experts=4,
            num_experts_per_tok=2,
            n_shared_experts=1,
            n_group=1,
            topk_group=1,
            first_k_dense_replace=1,
            kv_lora_rank=32,
            q_lora_rank=None,
            qk_nope_head_dim=16,
            qk_rope_head_dim=8,
            v_head_dim=16,
            **common,
        )
        model_class = DeepseekV3ForCausalLM
    torch.manual_seed(0)
    model = model_class(config).float().eval()
    model.to(dtype).save_pretrained(directory)
    return directory


def hf_greedy(model_dir: Path, prompts: list[list[int]], max_new_tokens: int) -> list[list[int]]:
    """Greedy continuations by transformers (full forward each step, no cache): the
    independent reference."""
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).eval()
    results = []
    with torch.inference_mode():
        for prompt in prompts:
            ids = torch.tensor([prompt])
            for _ in range(max_new_tokens):
                next_id = model(ids).logits[0, -1].argmax()
                ids = torch.cat([ids, next_id.view(1, 1)], dim=1)
            results.append(ids[0, len(prompt) :].tolist())
    return results
