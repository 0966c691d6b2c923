"""Multi-LoRA under tensor parallelism: two ranks (the mp executor's processes) each hold
their part of every adapter, cut as the base layers are (B by output rows on q/k/v and
gate/up, A by input columns on o_proj and down_proj), and one batch of base, adapter A
and adapter B requests gets the greedy tokens of transformers with each adapter merged
by PEFT."""

from __future__ import annotations

from pathlib import Path

import pytest
from test_lora_generate import expected, generate, mixed_batch


@pytest.mark.slow
def test_tp2_mixed_batch_matches_each_adapter_merged_by_peft(llama_dir: Path, llama_adapters: dict[str, Path]) -> None:
    prompts, loras, dirs = mixed_batch(llama_adapters)
    got = generate(llama_dir, prompts, loras, max_loras=2, tensor_parallel_size=2, distributed_executor_backend="mp")
    assert got == expected(llama_dir, dirs)
