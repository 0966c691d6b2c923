"""`LLMEngine.reset_prefix_cache` (what `POST /reset_prefix_cache` calls): the prefix
blocks nobody holds leave the cache, so the next identical prompt is computed afresh;
the blocks of a request running through the reset stay, and its greedy tokens do not
change."""

from __future__ import annotations

from pathlib import Path

import pytest

from accord import LLM, SamplingParams
from accord.core.outputs import RequestOutput

ENGINE_ARGS = dict(backend="cpu", max_model_len=256, max_num_batched_tokens=128, num_gpu_blocks_override=64)
#: Three full blocks of 16 and a tail: a repeat of it hits 48 cached tokens.
PROMPT = list(range(3, 55))
GREEDY = SamplingParams(temperature=0.0, max_tokens=12, ignore_eos=True)


@pytest.fixture(scope="module")
def llm(llama_dir: Path, make_llm) -> LLM:
    return make_llm(llama_dir, **ENGINE_ARGS)


def run(llm: LLM, prompt: list[int]) -> RequestOutput:
    return llm.generate({"prompt_token_ids": prompt}, GREEDY, use_tqdm=False)[0]


def test_after_a_reset_the_same_prompt_hits_nothing(llm: LLM) -> None:
    run(llm, PROMPT)
    assert run(llm, PROMPT).num_cached_tokens == 48, "before the reset the repeat hits the cache"
    hits_before = llm.llm_engine.stats.prefix_cache_hits
    assert llm.llm_engine.reset_prefix_cache() >= 3
    assert run(llm, PROMPT).num_cached_tokens == 0
    assert llm.llm_engine.stats.prefix_cache_hits == hits_before
    assert run(llm, PROMPT).num_cached_tokens == 48, "the recomputed prefix is cached again"


def test_a_request_running_through_a_reset_keeps_its_blocks_and_its_tokens(llm: LLM) -> None:
    prompt = list(range(100, 140))  # two full blocks and a tail
    expected = run(llm, prompt).outputs[0].token_ids
    llm.llm_engine.reset_prefix_cache()
    engine = llm.llm_engine
    engine.add_request("running", {"prompt_token_ids": prompt}, GREEDY)
    outputs: dict[str, RequestOutput] = {}
    while not outputs.get("running") or len(outputs["running"].outputs[0].token_ids) < 3:
        outputs.update((out.request_id, out) for out in engine.step())
    engine.reset_prefix_cache()
    # The running request's prompt blocks stayed cached: a newcomer with its prefix hits them.
    engine.add_request("newcomer", {"prompt_token_ids": prompt[:33] + [7, 7]}, GREEDY)
    while engine.has_unfinished_requests():
        outputs.update((out.request_id, out) for out in engine.step())
    assert outputs["running"].outputs[0].token_ids == expected
    assert outputs["newcomer"].num_cached_tokens == 32
