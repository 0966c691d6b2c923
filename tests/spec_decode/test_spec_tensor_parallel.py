"""Speculative decoding over two tensor-parallel ranks (a worker process each): the
driver proposes, every rank checks the same drafts with the same uniforms, and the
greedy outputs equal those of one rank without speculation."""

from __future__ import annotations

import pytest

from accord import LLM
from accord.core.sampling_params import SamplingParams

#: Each test generates through a model (seconds on a 2-core host): the slow tier.
pytestmark = pytest.mark.slow

PROMPTS = [list(range(100 + 7 * i, 130 + 7 * i)) + list(range(100 + 7 * i, 106 + 7 * i)) for i in range(3)]
ENGINE = {"backend": "cpu", "max_model_len": 256, "num_gpu_blocks_override": 64}


def test_tp2_with_speculation_equals_tp1_without(counting_llama_dir) -> None:
    params = SamplingParams(max_tokens=24, temperature=0.0)
    prompts = [{"prompt_token_ids": p} for p in PROMPTS]
    tp2 = LLM(str(counting_llama_dir), tensor_parallel_size=2,
              speculative_config={"method": "ngram", "num_speculative_tokens": 3}, **ENGINE)
    try:
        got = [o.outputs[0].token_ids for o in tp2.generate(prompts, params, use_tqdm=False)]
        stats = tp2.llm_engine.stats
        assert stats.spec_decode_num_accepted_tokens > 0 and stats.kv_blocks_used == 0
    finally:
        tp2.llm_engine.shutdown()
    tp1 = LLM(str(counting_llama_dir), **ENGINE)
    try:
        assert got == [o.outputs[0].token_ids for o in tp1.generate(prompts, params, use_tqdm=False)]
    finally:
        tp1.llm_engine.shutdown()
