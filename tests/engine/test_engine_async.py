"""AsyncLLM: streamed cumulative outputs, abort on disconnect, stats for metrics."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest
from engine_faults import POISON_TOKEN, poison_the_model

from accord import AsyncLLM, SamplingParams


@pytest.fixture
def async_llm(llama_dir: Path, make_llm) -> AsyncLLM:
    """A fresh AsyncLLM (each test runs its own event loop) over a shared engine."""
    llm = make_llm(llama_dir, backend="cpu", max_model_len=512, num_gpu_blocks_override=64)
    return AsyncLLM(llm.llm_engine)


def collect(async_llm: AsyncLLM, prompt, params: SamplingParams, request_id: str) -> list:
    async def main() -> list:
        try:
            return [output async for output in async_llm.generate(prompt, params, request_id)]
        finally:
            await async_llm.shutdown()

    return asyncio.run(main())


def test_streamed_outputs_are_cumulative_and_end_finished(async_llm: AsyncLLM) -> None:
    params = SamplingParams(temperature=0.0, max_tokens=5, ignore_eos=True)
    outputs = collect(async_llm, {"prompt_token_ids": [5, 6, 7]}, params, "stream")
    token_counts = [len(o.outputs[0].token_ids) for o in outputs]
    assert token_counts == [1, 2, 3, 4, 5]
    assert [o.finished for o in outputs] == [False] * 4 + [True]
    assert outputs[-1].outputs[0].token_ids[:3] == outputs[2].outputs[0].token_ids


def test_closing_the_stream_aborts_the_request_and_frees_its_blocks(async_llm: AsyncLLM) -> None:
    async def main() -> None:
        stream = async_llm.generate(
            {"prompt_token_ids": list(range(100))}, SamplingParams(max_tokens=200, ignore_eos=True), "gone"
        )
        await anext(stream)
        assert async_llm.num_allocated_blocks > 0
        await stream.aclose()
        for _ in range(100):
            if async_llm.num_allocated_blocks == 0 and not async_llm.engine.has_unfinished_requests():
                break
            await asyncio.sleep(0.01)
        await async_llm.shutdown()

    asyncio.run(main())
    assert async_llm.num_allocated_blocks == 0


def test_invalid_requests_raise_value_error_before_any_output(async_llm: AsyncLLM) -> None:
    with pytest.raises(ValueError, match="prompt token ids"):
        collect(async_llm, {"prompt_token_ids": [10**6]}, SamplingParams(), "bad")


def test_stats_count_tokens_and_latencies(async_llm: AsyncLLM) -> None:
    before = async_llm.get_stats()
    outputs = collect(
        async_llm, {"prompt_token_ids": [1, 2, 3, 4]}, SamplingParams(max_tokens=3, ignore_eos=True), "timed"
    )
    after = async_llm.get_stats()
    assert after.generation_tokens - before.generation_tokens == 3
    assert after.prompt_tokens - before.prompt_tokens == 4
    times = outputs[-1].metrics
    assert 0 <= times.queue_time <= times.time_to_first_token <= times.e2e_latency
    assert times.time_per_output_token is not None


def test_abort_ends_the_stream_with_an_abort_output_and_frees_its_blocks(async_llm: AsyncLLM) -> None:
    async def main() -> list:
        stream = async_llm.generate(
            {"prompt_token_ids": list(range(40))}, SamplingParams(max_tokens=200, ignore_eos=True), "stopped"
        )
        outputs = [await anext(stream)]
        await async_llm.abort("stopped")
        outputs += [output async for output in stream]
        await async_llm.shutdown()
        return outputs

    outputs = asyncio.run(main())
    assert outputs[-1].finished and outputs[-1].outputs[0].finish_reason == "abort"
    assert len(outputs[-1].outputs[0].token_ids) < 200
    assert async_llm.num_allocated_blocks == 0
    assert async_llm.get_stats().num_running == 0, "gauges are refreshed by the abort"


def test_a_step_failing_because_of_one_request_fails_only_that_request(
    async_llm: AsyncLLM, monkeypatch: pytest.MonkeyPatch
) -> None:
    from accord.core.engine.async_llm import RequestFailedError

    params = SamplingParams(temperature=0.0, max_tokens=3, ignore_eos=True)
    healthy_prompt = {"prompt_token_ids": [5, 6, 7, 8]}

    async def consume(prompt, request_id):
        try:
            return [o async for o in async_llm.generate(prompt, params, request_id)]
        except RequestFailedError as error:
            return error

    async def main():
        alone = await consume(healthy_prompt, "alone")
        poison_the_model(async_llm.engine, monkeypatch)
        results = await asyncio.gather(
            consume({"prompt_token_ids": [5, 6, POISON_TOKEN]}, "unlucky"), consume(healthy_prompt, "lucky")
        )
        served = await consume(healthy_prompt, "next")
        await async_llm.shutdown()
        return (alone[-1].outputs[0].token_ids, *results, served)

    alone, unlucky, lucky, served = asyncio.run(main())
    assert isinstance(unlucky, RequestFailedError) and "injected kernel failure" in str(unlucky)
    assert lucky[-1].finished and lucky[-1].outputs[0].token_ids == alone
    assert served[-1].finished and served[-1].outputs[0].token_ids == alone
    assert async_llm.num_allocated_blocks == 0
    assert not async_llm.errored
