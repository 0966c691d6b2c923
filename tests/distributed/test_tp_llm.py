"""End to end through `LLM(model, tensor_parallel_size=2, distributed_executor_backend=
"mp")`: every architecture's greedy tokens equal transformers', in one run that forces
chunked prefill, prefix-cache hits and preemption (the mp executor tests cover Llama
with as many kv heads as ranks and DeepSeek-V3 the same way; Qwen2's sharded q/k/v
bias and tied head are checked at the logits level in test_tp_forward.py)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch
from engine_models import hf_greedy, write_tokenizer
from processes import wait_until_gone
from test_executor_mp import MAX_NEW_TOKENS, PRESSURE, generate, pressure_prompts
from tiny_models import build_tiny_model

from accord import LLM

#: (test id, tiny architecture, overrides) for the architectures tests/executor leaves out.
VARIANTS = [
    ("llama-kv1", "llama", {"num_key_value_heads": 1}),
    # SmolLM2-135M's head counts: 9 query and 3 key/value heads cut unevenly over 2 ranks.
    ("llama-9-heads", "llama", {"hidden_size": 144, "num_attention_heads": 9, "num_key_value_heads": 3}),
    ("qwen3", "qwen3", {}),
    ("mixtral", "mixtral", {}),
    ("qwen3_moe", "qwen3_moe", {}),
]


def save_with_tokenizer(directory: Path, architecture: str, overrides: dict) -> Path:
    """The tiny model with the demo tokenizer's vocabulary and special ids, in fp32."""
    directory.mkdir(parents=True)
    vocab_size, bos_id, eos_id = write_tokenizer(directory)
    model = build_tiny_model(architecture, vocab_size=vocab_size, bos_token_id=bos_id, eos_token_id=eos_id, **overrides)
    model.float().save_pretrained(directory)
    return directory


def tp2_mp_greedy_under_pressure(model: str, **settings: Any) -> tuple[list[list[int]], list[list[int]]]:
    """(prompts, greedy tokens) of `model` under tp=2 on the mp executor with PRESSURE's
    budgets (and `settings`), having checked that preemption and prefix-cache hits
    happened and that the rank processes are gone after shutdown."""
    llm = LLM(model, tensor_parallel_size=2, distributed_executor_backend="mp", **{**PRESSURE, **settings})
    try:
        workers = llm.llm_engine.executor.worker_pids
        prompts = pressure_prompts(llm.llm_engine.model_config.vocab_size)
        tokens = generate(llm, prompts)
        stats = llm.llm_engine.stats
        assert stats.num_preemptions > 0 and stats.prefix_cache_hits > 0
    finally:
        llm.llm_engine.shutdown()
    assert wait_until_gone(workers) == []
    return prompts, tokens


@pytest.mark.slow
@pytest.mark.parametrize("name,architecture,overrides", VARIANTS, ids=[v[0] for v in VARIANTS])
def test_tp2_mp_greedy_equals_transformers(name: str, architecture: str, overrides: dict, tmp_path: Path) -> None:
    model_dir = save_with_tokenizer(tmp_path / name, architecture, overrides)
    prompts, tokens = tp2_mp_greedy_under_pressure(str(model_dir))
    with torch.inference_mode():
        assert tokens == hf_greedy(model_dir, prompts, MAX_NEW_TOKENS)
