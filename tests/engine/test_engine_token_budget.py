"""The default step token budget: for serving, the largest power-of-two budget whose
measured step keeps within 5 one-token steps (Sarathi-Serve's strict target), between a
floor of max_num_seqs and vLLM's online 2048; for offline `LLM`, vLLM-CPU's 4096,
unmeasured; a configured budget is never measured."""

from __future__ import annotations

from pathlib import Path

import pytest

from accord.core.engine.token_budget import DECODE_REPEATS, OFFLINE_BUDGET, candidate_budgets, choose_token_budget
from accord.core.worker.worker import Worker


def timed(fixed: float, per_token: float, calls: list[int]):
    """A step-time model: `fixed` seconds plus `per_token` per token, logging each call."""

    def step_seconds(tokens: int) -> float:
        calls.append(tokens)
        return fixed + per_token * tokens

    return step_seconds


@pytest.mark.parametrize(("floor", "ceiling", "expected"), [
    (256, 2048, [256, 512, 1024, 2048]),
    (200, 2048, [256, 512, 1024, 2048]),
    (64, 1000, [64, 128, 256, 512, 1000]),
    (4096, 2048, [2048]),
    (1, 4, [1, 2, 4]),
])
def test_candidates_double_from_the_floor_to_the_ceiling(floor: int, ceiling: int, expected: list[int]) -> None:
    assert candidate_budgets(floor, ceiling) == expected


@pytest.mark.parametrize(("fixed", "per_token"), [(0.010, 0.0001), (0.010, 0.00002), (0.001, 0.001), (0.05, 1e-6)])
def test_the_largest_budget_within_five_decode_steps_is_chosen(fixed: float, per_token: float) -> None:
    calls: list[int] = []
    budget = choose_token_budget(timed(fixed, per_token, calls), floor=64, ceiling=2048)
    decode = fixed + per_token
    within = [n for n in candidate_budgets(64, 2048) if fixed + per_token * n <= 5 * decode]
    assert budget.tokens == (within[-1] if within else 64)
    assert budget.target_seconds == pytest.approx(5 * decode)
    # Ascending, stopping at the first budget over the target: never past one too slow.
    budgets = calls[DECODE_REPEATS:]
    over = [n for n in budgets if fixed + per_token * n > 5 * decode]
    assert calls[:DECODE_REPEATS] == [1] * DECODE_REPEATS and budgets == sorted(budgets) and len(over) <= 1
    assert list(budget.measured) == budgets


def test_when_even_the_floor_is_too_slow_the_floor_is_the_budget() -> None:
    calls: list[int] = []
    budget = choose_token_budget(timed(0.0, 1.0, calls), floor=256, ceiling=2048)
    assert budget.tokens == 256 and calls == [1] * DECODE_REPEATS + [256]


def test_the_engine_measures_a_default_budget_and_schedules_with_it(llama_dir: Path, monkeypatch) -> None:
    """The serving engine (what `accord serve` and AsyncLLM build) measures its default."""
    from accord import SamplingParams
    from accord.entrypoints import LLMEngine

    measured: list[int] = []
    original = Worker.time_step

    def recording(self: Worker, num_tokens: int) -> float:
        measured.append(num_tokens)
        return original(self, num_tokens)

    monkeypatch.setattr(Worker, "time_step", recording)
    engine = LLMEngine.from_engine_args(str(llama_dir), max_model_len=256, max_num_seqs=8, kv_cache_memory=8 << 20)
    try:
        budget = engine.config.max_num_batched_tokens
        assert measured[:DECODE_REPEATS] == [1] * DECODE_REPEATS and budget in measured[DECODE_REPEATS:]
        assert budget in candidate_budgets(8, 2048)
        assert engine.scheduler.max_num_batched_tokens == budget
        engine.add_request("0", {"prompt_token_ids": list(range(3, 40))}, SamplingParams(max_tokens=4, ignore_eos=True))
        tokens = []
        while engine.has_unfinished_requests():
            tokens = [out.outputs[0].token_ids for out in engine.step() if out.finished] or tokens
        assert len(tokens[0]) == 4
    finally:
        engine.shutdown()


def test_offline_generation_defaults_to_the_throughput_budget_without_measuring(llama_dir: Path, monkeypatch) -> None:
    from accord import LLM, SamplingParams

    def refuse(self: Worker, num_tokens: int) -> float:
        raise AssertionError("offline generation's default budget must not be measured")

    monkeypatch.setattr(Worker, "time_step", refuse)
    llm = LLM(model=str(llama_dir), max_model_len=256, max_num_seqs=8, kv_cache_memory=8 << 20)
    assert llm.llm_engine.scheduler.max_num_batched_tokens == OFFLINE_BUDGET == 4096
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
