"""The CPU KV tier (--kv-offloading-size): a prefix whose blocks the device pool has
evicted is copied back from host memory, not recomputed, and the greedy tokens are
those of an engine that never evicted it."""

from __future__ import annotations

import random
from pathlib import Path

import pytest

from accord import LLM
from accord.core.sampling_params import SamplingParams

BLOCK = 16
#: A device pool of 16 blocks: a 97-token prompt and its output take 7, so four more
#: such requests evict every cached block of the first.
ENGINE_ARGS = dict(backend="cpu", max_model_len=128, num_gpu_blocks_override=16, max_num_batched_tokens=128,
                   block_size=BLOCK, max_num_seqs=1)
GREEDY = SamplingParams(temperature=0.0, max_tokens=4, ignore_eos=True)


def _prompts(count: int, length: int) -> list[dict]:
    rng = random.Random(0)
    return [{"prompt_token_ids": [rng.randrange(3, 200) for _ in range(length)]} for _ in range(count)]


def _tokens(llm: LLM, prompt: dict) -> list[int]:
    return llm.generate([prompt], GREEDY)[0].outputs[0].token_ids


@pytest.fixture(scope="module")
def offloading(llama_dir: Path) -> LLM:
    # 256 KiB: 32 blocks of the tiny Llama's 8 KiB.
    return LLM(str(llama_dir), kv_offloading_size=1 / 4096, **ENGINE_ARGS)


def test_an_evicted_prefix_is_loaded_from_the_cpu_tier_with_the_same_tokens(llama_dir: Path, offloading: LLM) -> None:
    first, *others = _prompts(5, 6 * BLOCK + 1)
    plain = LLM(str(llama_dir), **ENGINE_ARGS)
    expected = _tokens(plain, first)
    engine = offloading.llm_engine
    manager = engine.scheduler.block_manager
    assert _tokens(offloading, first) == expected
    for prompt in others:
        _tokens(offloading, prompt)
    assert manager.find_cached_prefix(first["prompt_token_ids"], 6 * BLOCK) == []  # evicted from the device
    computed, hits = engine.stats.computed_prompt_tokens, manager.counters.hits
    again = offloading.generate([first], GREEDY)[0]
    assert again.outputs[0].token_ids == expected
    # Six full blocks came from the CPU tier: only the last prompt token was computed.
    assert engine.stats.computed_prompt_tokens - computed == 1
    assert again.num_cached_tokens == 6 * BLOCK
    assert manager.counters.hits - hits == 0
    assert manager.num_free_blocks == manager.num_blocks


def test_many_prompts_through_a_full_tier_keep_their_tokens(llama_dir: Path, offloading: LLM) -> None:
    # More blocks (72) than the tier holds (32) cycle through it: slots are evicted and
    # reassigned while earlier prefixes are loaded back, and every answer stays right.
    prompts = _prompts(12, 6 * BLOCK + 1)
    plain = LLM(str(llama_dir), **ENGINE_ARGS)
    expected = [_tokens(plain, prompt) for prompt in prompts]
    order = prompts + prompts[::-1] + prompts[::3]
    wanted = expected + expected[::-1] + expected[::3]
    assert [_tokens(offloading, prompt) for prompt in order] == wanted
    manager = offloading.llm_engine.scheduler.block_manager
    assert manager.num_free_blocks == manager.num_blocks
    tier = offloading.llm_engine.scheduler.kv_connector
    assert tier.blocks_loaded > 0 and tier.blocks_stored > tier.num_slots


@pytest.mark.slow
def test_a_failed_steps_blocks_are_not_served_from_the_tier(
    llama_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from engine_faults import POISON_TOKEN, poison_the_model

    llm = LLM(str(llama_dir), kv_offloading_size=1 / 4096, **{**ENGINE_ARGS, "max_num_seqs": 2})
    engine = llm.llm_engine
    poison_the_model(engine, monkeypatch)
    clean, *others = _prompts(4, 6 * BLOCK + 1)
    poisoned = {"prompt_token_ids": [POISON_TOKEN] * (6 * BLOCK + 1)}
    expected = _tokens(LLM(str(llama_dir), **ENGINE_ARGS), clean)
    # One step holds both prompts and fails; the clean one is re-run alone (its KV is
    # written) but the step's copies to the tier never ran.
    outputs = llm.generate([clean, poisoned], GREEDY)
    assert outputs[0].outputs[0].token_ids == expected and outputs[1].outputs[0].finish_reason == "error"
    for prompt in others:
        _tokens(llm, prompt)
    assert engine.scheduler.block_manager.find_cached_prefix(clean["prompt_token_ids"], 6 * BLOCK) == []
    computed = engine.stats.computed_prompt_tokens
    assert _tokens(llm, clean) == expected
    # Recomputed in full: the tier forgot the blocks whose copies were lost.
    assert engine.stats.computed_prompt_tokens - computed == 6 * BLOCK + 1
