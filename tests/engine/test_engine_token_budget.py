"""The default step token budget and prefill chunk: the chunk is the largest power of
two up to vLLM's online 2048 whose measured step keeps within 5 one-token steps
(Sarathi-Serve's strict target); the budget is that chunk raised to max_num_seqs; a
configured budget is never measured."""

from __future__ import annotations

from pathlib import Path

import pytest

from accord.core.token_budget import DECODE_REPEATS, candidate_chunks, choose_token_budget
from accord.core.worker import Worker


def timed(fixed: float, per_token: float, calls: list[int]):
    """A step-time model: `fixed` seconds plus `per_token` per token, logging each call."""

    def step_seconds(tokens: int) -> float:
        calls.append(tokens)
        return fixed + per_token * tokens

    return step_seconds


@pytest.mark.parametrize(("ceiling", "expected"), [
    (2048, [1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024, 2048]),
    (1000, [1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1000]),
    (1, [1]),
])
def test_candidates_are_powers_of_two_up_to_the_ceiling(ceiling: int, expected: list[int]) -> None:
    assert candidate_chunks(ceiling) == expected


@pytest.mark.parametrize("floor", [1, 64, 200, 256])
@pytest.mark.parametrize(("fixed", "per_token"), [
    (0.010, 0.0001), (0.010, 0.00002), (0.001, 0.001), (0.05, 1e-6), (0.077, 0.0018), (0.0, 1.0),
])
def test_the_largest_chunk_within_five_decode_steps_is_chosen(floor: int, fixed: float, per_token: float) -> None:
    calls: list[int] = []
    budget = choose_token_budget(timed(fixed, per_token, calls), floor=floor, ceiling=2048)
    decode = fixed + per_token
    powers = [1 << k for k in range(12)]
    within = [n for n in powers if fixed + per_token * n <= 5 * decode]
    assert budget.prefill_chunk == within[-1]
    assert budget.tokens == max(within[-1], floor)
    assert budget.target_seconds == pytest.approx(5 * decode)
    # The search measures the candidate at the floor, then walks one way only: up to
    # the first candidate over the target, or down to the first within it.
    assert calls[:DECODE_REPEATS] == [1] * DECODE_REPEATS
    start = next(n for n in powers if n >= floor)
    if start in within:
        walk = [n for n in powers if start <= n <= min(2 * within[-1], 2048)]
    else:
        walk = [n for n in reversed(powers) if within[-1] <= n <= start]
    assert calls[DECODE_REPEATS:] == walk and list(budget.measured) == walk


def test_on_a_slow_device_the_chunk_falls_below_the_floor_and_the_budget_stays_at_it() -> None:
    # Step times as measured on a 2-core CPU: 77 ms per decode step, ~1.8 ms per prompt token.
    calls: list[int] = []
    budget = choose_token_budget(timed(0.077, 0.0018, calls), floor=256, ceiling=2048)
    assert (budget.tokens, budget.prefill_chunk) == (256, 128)
    assert calls == [1] * DECODE_REPEATS + [256, 128]


def test_the_engine_measures_a_default_budget_and_schedules_with_it(llama_dir: Path, monkeypatch) -> None:
    from accord import LLM, SamplingParams

    measured: list[int] = []
    original = Worker.time_step

    def recording(self: Worker, num_tokens: int) -> float:
        measured.append(num_tokens)
        return original(self, num_tokens)

    monkeypatch.setattr(Worker, "time_step", recording)
    llm = LLM(model=str(llama_dir), max_model_len=256, max_num_seqs=8, kv_cache_memory=8 << 20)
    engine = llm.llm_engine
    budget, chunk = engine.config.max_num_batched_tokens, engine.scheduler.prefill_chunk
    assert measured[:DECODE_REPEATS] == [1] * DECODE_REPEATS and chunk in measured[DECODE_REPEATS:]
    assert budget == max(chunk, 8) and chunk in candidate_chunks(2048)
    assert engine.scheduler.max_num_batched_tokens == budget
    out = llm.generate({"prompt_token_ids": list(range(3, 40))}, SamplingParams(max_tokens=4, ignore_eos=True),
                       use_tqdm=False)
    assert len(out[0].outputs[0].token_ids) == 4


def test_a_configured_budget_is_used_without_measuring(llama_dir: Path, monkeypatch) -> None:
    from accord import LLM

    def refuse(self: Worker, num_tokens: int) -> float:
        raise AssertionError("a configured budget must not be measured")

    monkeypatch.setattr(Worker, "time_step", refuse)
    llm = LLM(model=str(llama_dir), max_model_len=256, max_num_seqs=8, max_num_batched_tokens=96,
              kv_cache_memory=8 << 20)
    assert llm.llm_engine.scheduler.max_num_batched_tokens == 96
    assert llm.llm_engine.scheduler.prefill_chunk == 96
