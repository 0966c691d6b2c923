"""Async scheduling (--async-scheduling): the next step is scheduled while the current
one runs, and every output equals the synchronous engine's, token for token: greedy and
seeded sampling over a mix of lengths, max_tokens, stop strings and stop tokens,
penalties and logprobs, n > 1, aborts while a step is in flight, preemption under a
tiny KV budget, a request that breaks its step, grammar-constrained requests. Every KV
block is free at the end (the conftest checks that after each test)."""

from __future__ import annotations

import threading
from pathlib import Path

import pytest
import torch
from engine_faults import POISON_TOKEN, poison_the_model

from accord import LLM, SamplingParams
from accord.core.sched.block_manager import BlockManager
from accord.core.sched.output import ModelRunnerOutput
from accord.core.sched.scheduler import Scheduler
from accord.core.sched.request import Request
from accord.core.structured_output import StructuredOutputsParams

ENGINE_ARGS = dict(backend="cpu", max_model_len=256, max_num_batched_tokens=64, num_gpu_blocks_override=128)


def random_prompt(length: int, seed: int, vocab_size: int = 800) -> list[int]:
    return torch.randint(0, vocab_size, (length,), generator=torch.Generator().manual_seed(seed)).tolist()


@pytest.fixture(scope="module")
def engines(llama_dir: Path, make_llm) -> tuple[LLM, LLM]:
    """The same engine twice: synchronous, and with async scheduling."""
    return make_llm(llama_dir, **ENGINE_ARGS), make_llm(llama_dir, async_scheduling=True, **ENGINE_ARGS)


def summary(outputs) -> list[tuple]:
    """What must be equal, in prompt order: every completion's tokens, text, finish and
    stop reasons, and its logprobs (sampled token's and top candidates')."""
    rows = []
    for output in outputs:
        for completion in output.outputs:
            logprobs = [
                sorted((token, round(entry.logprob, 4)) for token, entry in step.items())
                for step in completion.logprobs or []
            ]
            rows.append(
                (completion.index, completion.token_ids, completion.text, completion.finish_reason,
                 completion.stop_reason, logprobs)
            )
    return rows


def generate_both(engines: tuple[LLM, LLM], prompts: list, params) -> tuple[list, list]:
    sync, pipelined = engines
    return (
        summary(sync.generate(prompts, params, use_tqdm=False)),
        summary(pipelined.generate(prompts, params, use_tqdm=False)),
    )


def test_a_mixed_batch_is_the_same_token_for_token(engines: tuple[LLM, LLM]) -> None:
    lengths = [3, 40, 7, 130, 1, 65, 18, 9]
    prompts = [{"prompt_token_ids": random_prompt(n, seed=n)} for n in lengths]
    params = [
        SamplingParams(temperature=0.0, max_tokens=1, ignore_eos=True),
        SamplingParams(temperature=0.0, max_tokens=17, ignore_eos=True, logprobs=3),
        SamplingParams(temperature=0.8, top_k=20, seed=7, max_tokens=12, ignore_eos=True),
        SamplingParams(temperature=0.0, max_tokens=9, ignore_eos=True, repetition_penalty=1.3),
        SamplingParams(temperature=0.0, max_tokens=24, ignore_eos=True, presence_penalty=0.5, frequency_penalty=0.4),
        SamplingParams(temperature=1.0, seed=3, n=2, max_tokens=6, ignore_eos=True, logprobs=1),
        SamplingParams(temperature=0.0, max_tokens=30, ignore_eos=True, prompt_logprobs=2),
        SamplingParams(temperature=0.0, max_tokens=5, min_tokens=3, ignore_eos=True),
    ]
    sync, pipelined = generate_both(engines, prompts, params)
    assert pipelined == sync
    assert len(sync) == 9 and {row[3] for row in sync} == {"length"}


def test_stop_tokens_and_strings_end_at_the_same_token(engines: tuple[LLM, LLM]) -> None:
    prompts = [{"prompt_token_ids": random_prompt(n, seed=100 + n)} for n in (5, 12, 33)]
    # Stop on tokens and text the synchronous engine is known to produce mid-way.
    free = engines[0].generate(prompts, SamplingParams(temperature=0.0, max_tokens=12, ignore_eos=True),
                               use_tqdm=False)
    stop_token = free[0].outputs[0].token_ids[4]
    stop_text = free[1].outputs[0].text[3:5]
    assert stop_text, "the model produced too little text to stop on"
    params = [
        SamplingParams(temperature=0.0, max_tokens=12, stop_token_ids=[stop_token], ignore_eos=True),
        SamplingParams(temperature=0.0, max_tokens=12, stop=[stop_text], ignore_eos=True),
        SamplingParams(temperature=0.0, max_tokens=12),
    ]
    sync, pipelined = generate_both(engines, prompts, params)
    assert pipelined == sync
    assert sync[0][3:5] == ("stop", stop_token) and sync[1][3:5] == ("stop", stop_text)


def test_the_next_step_is_scheduled_while_the_current_one_runs(
    engines: tuple[LLM, LLM], monkeypatch: pytest.MonkeyPatch
) -> None:
    engine = engines[1].llm_engine
    runner = engine.executor.driver_worker.runner
    release, running = threading.Event(), threading.Event()
    real_forward = runner.forward

    def held_forward(*args, **kwargs):
        running.set()
        assert release.wait(60), "the test never released the step"
        return real_forward(*args, **kwargs)

    monkeypatch.setattr(runner, "forward", held_forward)
    engine.add_request("held", {"prompt_token_ids": random_prompt(10, seed=1)},
                       SamplingParams(temperature=0.0, max_tokens=3, ignore_eos=True))
    (seq,) = engine.scheduler.requests.values()
    assert engine.step() == []  # the prompt's step is launched, not waited for
    assert running.wait(60)
    second = threading.Thread(target=engine.step)
    second.start()
    # The decode step is scheduled (over the placeholder of the token the held step
    # samples) while the prompt's step has not finished.
    for _ in range(600):
        if seq.num_computed_tokens == 11:
            break
        threading.Event().wait(0.05)
    assert (seq.num_computed_tokens, seq.num_output_placeholders, seq.num_output_tokens) == (11, 2, 0)
    release.set()
    second.join(60)
    outputs = []
    while engine.has_unfinished_requests():
        outputs += engine.step()
    assert outputs[-1].outputs[0].token_ids == engines[0].generate(
        {"prompt_token_ids": random_prompt(10, seed=1)},
        SamplingParams(temperature=0.0, max_tokens=3, ignore_eos=True), use_tqdm=False,
    )[0].outputs[0].token_ids


def test_an_abort_while_a_step_is_in_flight_frees_the_blocks_and_spares_the_rest(engines: tuple[LLM, LLM]) -> None:
    prompts = {f"r{n}": random_prompt(n, seed=200 + n) for n in (8, 50, 21)}
    params = SamplingParams(temperature=0.0, max_tokens=10, ignore_eos=True)
    alone = engines[0].generate([{"prompt_token_ids": p} for p in prompts.values()], params, use_tqdm=False)
    expected = {request_id: output.outputs[0].token_ids for request_id, output in zip(prompts, alone)}
    engine = engines[1].llm_engine
    for request_id, prompt in prompts.items():
        engine.add_request(request_id, {"prompt_token_ids": prompt}, params)
    latest = {}
    for _ in range(4):
        latest.update((output.request_id, output) for output in engine.step())
    assert engine._in_flight, "no step in flight when the abort comes"
    assert not latest["r50"].finished
    (aborted,) = engine.abort_request("r50")
    assert aborted.finished and aborted.outputs[0].finish_reason == "abort"
    finished = {}
    while engine.has_unfinished_requests():
        finished.update((output.request_id, output) for output in engine.step() if output.finished)
    assert "r50" not in finished
    assert {rid: finished[rid].outputs[0].token_ids for rid in ("r8", "r21")} == {
        rid: expected[rid] for rid in ("r8", "r21")
    }
    while engine._in_flight:
        assert engine.step() == []  # the steps still in flight land; tokens of ended requests are dropped
    assert engine.scheduler.block_manager.num_used_blocks == 0


def test_preemption_under_a_tiny_kv_budget_gives_the_same_tokens(llama_dir: Path, make_llm) -> None:
    tiny = dict(ENGINE_ARGS, num_gpu_blocks_override=20, max_model_len=128)
    sync, pipelined = make_llm(llama_dir, **tiny), make_llm(llama_dir, async_scheduling=True, **tiny)
    prompts = [{"prompt_token_ids": random_prompt(n, seed=300 + n)} for n in (30, 45, 20, 38, 50)]
    params = SamplingParams(temperature=0.0, max_tokens=40, ignore_eos=True, logprobs=1)
    before = pipelined.llm_engine.stats.num_preemptions
    outcome = generate_both((sync, pipelined), prompts, params)
    assert pipelined.llm_engine.stats.num_preemptions > before, "the budget was not tight enough to preempt"
    assert outcome[1] == outcome[0]


def test_a_request_that_breaks_its_step_fails_alone(engines: tuple[LLM, LLM], monkeypatch: pytest.MonkeyPatch) -> None:
    healthy = [random_prompt(30, seed=31), random_prompt(45, seed=32), random_prompt(12, seed=33)]
    params = SamplingParams(temperature=0.0, max_tokens=6, ignore_eos=True)
    alone = [engines[0].generate({"prompt_token_ids": p}, params, use_tqdm=False)[0].outputs[0].token_ids
             for p in healthy]
    pipelined = engines[1]
    # A decode step in flight when the poisoned prompt's step fails: start one first.
    pipelined.llm_engine.add_request("early", {"prompt_token_ids": healthy[2]}, params)
    pipelined.llm_engine.step()
    poison_the_model(pipelined.llm_engine, monkeypatch)
    prompts = [healthy[0], random_prompt(20, seed=34) + [POISON_TOKEN], healthy[1]]
    outputs = pipelined.generate([{"prompt_token_ids": p} for p in prompts], params, use_tqdm=False)
    assert [o.outputs[0].finish_reason for o in outputs] == ["length", "error", "length"]
    assert "injected kernel failure" in outputs[1].outputs[0].stop_reason
    assert [outputs[0].outputs[0].token_ids, outputs[2].outputs[0].token_ids] == alone[:2]
    assert "early" not in pipelined.llm_engine.output_processor, "the early request did not finish with the batch"


@pytest.mark.slow
def test_grammar_constrained_requests_step_one_at_a_time_and_match(engines: tuple[LLM, LLM]) -> None:
    prompts = [{"prompt_token_ids": random_prompt(n, seed=400 + n)} for n in (6, 14)]
    params = [
        SamplingParams(temperature=0.0, max_tokens=12, structured_outputs=StructuredOutputsParams(regex="[ab]{2,8}")),
        SamplingParams(temperature=0.0, max_tokens=12, ignore_eos=True),
    ]
    sync, pipelined = generate_both(engines, prompts, params)
    assert pipelined == sync
    assert set(sync[0][2]) <= {"a", "b"} and 2 <= len(sync[0][2]) <= 8


# -- the scheduler alone, two steps in flight -----------------------------------------------
def make_seq(seq_id: str, length: int, **params) -> Request:
    return Request(req_id=seq_id, index=0, prompt_token_ids=list(range(1, length + 1)),
                    params=SamplingParams(ignore_eos=True, **params))


def result_of(samplers: list[str], token: int) -> ModelRunnerOutput:
    """The runner's results: each of `samplers` sampled `token`."""
    return ModelRunnerOutput(req_ids=samplers, sampled_token_ids=[token] * len(samplers),
                             logprobs=[0.0] * len(samplers), top_logprobs=[None] * len(samplers))


def test_the_scheduler_runs_one_step_ahead_and_never_past_max_tokens() -> None:
    scheduler = Scheduler(BlockManager(32, 4), 64, 8, max_model_len=64)
    seq = make_seq("a", 6, max_tokens=3)
    scheduler.add_request(seq)
    first = scheduler.schedule()
    second = scheduler.schedule()  # before the first step's token landed
    assert first.num_scheduled_tokens == {"a": 6} and second.num_scheduled_tokens == {"a": 1}
    assert (seq.num_computed_tokens, seq.num_output_placeholders) == (7, 2)
    assert second.scheduled_cached_reqs.num_computed_tokens == [6]
    scheduler.update_from_output(first, result_of(["a"], 11))
    third = scheduler.schedule()  # the third token is the last one max_tokens allows
    scheduler.update_from_output(second, result_of(["a"], 12))
    assert third.num_scheduled_tokens == {"a": 1}
    assert scheduler.schedule().is_empty  # three tokens are in flight or landed: no fourth step
    scheduler.update_from_output(third, result_of(["a"], 13))
    assert seq.output_token_ids == [11, 12, 13] and seq.finish_reason == "length"
    assert scheduler.block_manager.num_used_blocks == 0


def test_a_token_landing_after_its_sequence_stopped_is_dropped() -> None:
    scheduler = Scheduler(BlockManager(32, 4), 64, 8, max_model_len=64, eos_token_ids=[2])
    seq = make_seq("a", 5, max_tokens=10)
    seq.params = SamplingParams(max_tokens=10).for_child(0, {2})
    scheduler.add_request(seq)
    first = scheduler.schedule()
    second = scheduler.schedule()
    scheduler.update_from_output(first, result_of(["a"], 2))  # EOS: stops, frees its blocks
    assert seq.finish_reason == "stop" and scheduler.block_manager.num_used_blocks == 0
    assert scheduler.update_from_output(second, result_of(["a"], 9)) == []
    assert seq.output_token_ids == [2]
    assert scheduler.schedule().finished_req_ids == {"a"}


def test_the_server_engine_streams_the_same_tokens_and_a_closed_stream_frees_its_blocks(
    engines: tuple[LLM, LLM],
) -> None:
    import asyncio

    from accord import AsyncLLM

    prompt = random_prompt(25, seed=500)
    params = SamplingParams(temperature=0.0, max_tokens=12, ignore_eos=True)
    expected = engines[0].generate({"prompt_token_ids": prompt}, params, use_tqdm=False)[0].outputs[0].token_ids
    server = AsyncLLM(engines[1].llm_engine)

    async def main() -> list[int]:
        try:
            kept = server.generate({"prompt_token_ids": prompt}, params, "kept")
            closed = server.generate({"prompt_token_ids": random_prompt(60, seed=501)},
                                     SamplingParams(max_tokens=100, ignore_eos=True), "closed")
            await anext(kept)
            await anext(closed)
            await closed.aclose()  # aborted while the two requests' steps are in flight
            return [output async for output in kept][-1].outputs[0].token_ids
        finally:
            await server.shutdown()

    assert asyncio.run(main()) == expected
    engine = engines[1].llm_engine
    while engine._in_flight:
        engine.step()
    assert engine.scheduler.block_manager.num_used_blocks == 0
