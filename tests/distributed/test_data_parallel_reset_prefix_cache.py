"""`reset_prefix_cache` under data parallelism: it empties every replica's prefix
cache, not the first replica's only (each replica has its own block manager)."""

from __future__ import annotations

from pathlib import Path

import pytest
from test_executor_mp import PRESSURE
from test_tp_llm import save_with_tokenizer

from accord import LLM, SamplingParams

GREEDY = SamplingParams(temperature=0.0, max_tokens=2, ignore_eos=True)
#: Two prompts of two full blocks each, added together: one lands on each replica.
PROMPTS = [{"prompt_token_ids": list(range(first, first + 40))} for first in (3, 200)]


@pytest.mark.slow
def test_a_reset_empties_the_prefix_cache_of_every_replica(tmp_path: Path) -> None:
    llm = LLM(str(save_with_tokenizer(tmp_path / "llama", "llama", {})), data_parallel_size=2, **PRESSURE)
    engine = llm.llm_engine
    try:
        llm.generate(PROMPTS, GREEDY, use_tqdm=False)
        hits_before = [stats.prefix_cache_hits for stats in engine.replica_stats]
        repeated = [out.num_cached_tokens for out in llm.generate(PROMPTS, GREEDY, use_tqdm=False)]
        hits_repeated = [stats.prefix_cache_hits for stats in engine.replica_stats]
        engine.reset_prefix_cache()
        after_reset = [out.num_cached_tokens for out in llm.generate(PROMPTS, GREEDY, use_tqdm=False)]
        hits_after = [stats.prefix_cache_hits for stats in engine.replica_stats]
    finally:
        engine.shutdown()
    assert repeated == [32, 32]
    assert all(after > before for before, after in zip(hits_before, hits_repeated)), "both replicas hit"
    assert after_reset == [0, 0]
    assert hits_after == hits_repeated
