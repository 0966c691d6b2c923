"""Tensor parallelism over a compressed-tensors W4A16 checkpoint: each rank keeps its
slices of the packed codes (rows of q/k/v and gate/up, whole words and groups of o_proj
and down's input channels), and `LLM(dir, tensor_parallel_size=2)` generates the greedy
tokens tp=1 does, under chunked prefill, prefix caching and preemption."""

from __future__ import annotations

from pathlib import Path

import pytest
from compressed_tensors_writer import quantization_config, quantiser, scheme
from group_quant_models import WIDE, write_pair
from test_executor_mp import PRESSURE, generate
from test_tp_llm import save_with_tokenizer, tp2_mp_greedy_under_pressure

from accord import LLM


@pytest.mark.slow
def test_tp2_greedy_on_a_w4a16_checkpoint_equals_tp1(tmp_path: Path) -> None:
    source = save_with_tokenizer(tmp_path / "fp32", "llama", WIDE)
    chosen = scheme(4, False, 32)

    packed = tmp_path / "packed"
    write_pair(source, packed, tmp_path / "dense", quantiser(chosen), quantization_config(4, False, 32))
    prompts, tp2_tokens = tp2_mp_greedy_under_pressure(str(packed), dtype="float32")
    assert tp2_tokens == generate(LLM(str(packed), **PRESSURE, dtype="float32"), prompts)
