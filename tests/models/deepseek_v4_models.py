"""Tiny random DeepSeek-V4 checkpoints written by transformers (seeded), in DeepSeek's
release layout: hash layers whose int32 `tid2eid` rows are distinct random experts, a
sliding / CSA / HCA layer mix, hc_mult 2; plus transformers' prefix-only greedy
decoding, the independent reference (docs/deepseek_v4.md says why prefix-only)."""

from __future__ import annotations

import json
from pathlib import Path

import torch
from safetensors.torch import load_file, save_file

from accord.demo.tokenizer import BOS_TOKEN, CHAT_TEMPLATE, EOS_TOKEN, build_demo_tokenizer

EXPERTS, TOP_K = 8, 2
SLIDING_WINDOW = 8
CSA_RATE, HCA_RATE = 4, 8
LAYER_TYPES = [
    "sliding_attention", "compressed_sparse_attention", "heavily_compressed_attention", "compressed_sparse_attention",
]
MLP_LAYER_TYPES = ["hash_moe", "hash_moe", "moe", "moe"]


def write_tokenizer(directory: Path) -> tuple[int, int, int]:
    """The demo byte-level BPE tokenizer; returns (vocab size, bos id, eos id)."""
    tokenizer = build_demo_tokenizer()
    tokenizer.save(str(directory / "tokenizer.json"))
    config = {
        "tokenizer_class": "PreTrainedTokenizerFast", "bos_token": BOS_TOKEN, "eos_token": EOS_TOKEN,
        "chat_template": CHAT_TEMPLATE,
    }
    (directory / "tokenizer_config.json").write_text(json.dumps(config))
    return tokenizer.get_vocab_size(), tokenizer.token_to_id(BOS_TOKEN), tokenizer.token_to_id(EOS_TOKEN)


def build_v4_dir(directory: Path, index_topk: int = 3) -> Path:
    """A random fp32 V4 model saved as a Hugging Face directory. Weights are scaled so
    logits spread out (greedy choices are not near-ties); the indexer has 16 heads so
    its ReLU scores are almost never exactly 0, where top-k ties would be arbitrary."""
    from transformers import DeepseekV4Config, DeepseekV4ForCausalLM

    directory.mkdir(parents=True, exist_ok=True)
    vocab, bos_id, eos_id = write_tokenizer(directory)
    config = DeepseekV4Config(
        vocab_size=vocab, hidden_size=64, moe_intermediate_size=32, num_hidden_layers=len(LAYER_TYPES),
        num_attention_heads=4, num_key_value_heads=1, head_dim=32, q_lora_rank=32, qk_rope_head_dim=8,
        num_experts_per_tok=TOP_K, n_routed_experts=EXPERTS, n_shared_experts=1, routed_scaling_factor=1.5,
        layer_types=LAYER_TYPES, mlp_layer_types=MLP_LAYER_TYPES,
        compress_rates={"compressed_sparse_attention": CSA_RATE, "heavily_compressed_attention": HCA_RATE},
        hc_mult=2, hc_sinkhorn_iters=3, sliding_window=SLIDING_WINDOW, o_groups=2, o_lora_rank=16,
        index_n_heads=16, index_head_dim=16, index_topk=index_topk, num_nextn_predict_layers=0, swiglu_limit=1.0,
        max_position_embeddings=1024, bos_token_id=bos_id, eos_token_id=eos_id, tie_word_embeddings=False,
    )
    model = DeepseekV4ForCausalLM(config).float().eval()
    generator = torch.Generator().manual_seed(0)
    with torch.no_grad():
        for _, param in model.named_parameters():
            # Matrices at fan-in scale, vectors (norms, biases, sinks, scales) around 1 or 0.
            scale = param.shape[-1] ** -0.5 * 1.5 if param.dim() > 1 else 0.3
            param.copy_(torch.randn(param.shape, generator=generator) * scale + (1.0 if param.dim() == 1 else 0.0))
        for name, buffer in model.named_buffers():
            if name.endswith("e_score_correction_bias"):
                buffer.copy_(torch.randn(buffer.shape, generator=generator) * 0.1)
    model.save_pretrained(directory)
    _random_int32_tid2eid(directory / "model.safetensors", vocab, generator)
    return directory


def _random_int32_tid2eid(path: Path, vocab: int, generator: torch.Generator) -> None:
    """Rewrite every tid2eid as DeepSeek ships it: int32, each row TOP_K distinct experts."""
    tensors = load_file(path)
    for name in [n for n in tensors if n.endswith("tid2eid")]:
        rows = [torch.randperm(EXPERTS, generator=generator)[:TOP_K] for _ in range(vocab)]
        tensors[name] = torch.stack(rows).to(torch.int32)
    save_file(tensors, path, metadata={"format": "pt"})


def prefix_only_greedy(model_dir: Path, prompts: list[list[int]], max_new_tokens: int) -> list[list[int]]:
    """transformers' greedy continuation by the prefix-only forward: the whole prefix
    each step, no cache, the last position's argmax appended."""
    from transformers import DeepseekV4ForCausalLM

    model = DeepseekV4ForCausalLM.from_pretrained(model_dir, dtype=torch.float32).eval()
    results = []
    with torch.inference_mode():
        for prompt in prompts:
            ids = torch.tensor([prompt])
            for _ in range(max_new_tokens):
                next_id = model(ids, use_cache=False).logits[0, -1].argmax()
                ids = torch.cat([ids, next_id.view(1, 1)], dim=1)
            results.append(ids[0, len(prompt):].tolist())
    return results
