"""A structured output request's grammar compiles off the event loop, and the requests
already running keep stepping while it does."""

from __future__ import annotations

import asyncio
import re
import threading
from pathlib import Path

import pytest

from accord import AsyncLLM, SamplingParams
from accord.core.structured_output import StructuredOutputsParams

#: Long enough for the unconstrained request to finish; the compile gives up after it,
#: so an implementation that compiles on the event loop fails instead of hanging.
HOLD_S = 60.0


@pytest.fixture
def async_llm(llama_dir: Path, make_llm) -> AsyncLLM:
    llm = make_llm(llama_dir, backend="cpu", max_model_len=512, num_gpu_blocks_override=64)
    return AsyncLLM(llm.llm_engine)


@pytest.mark.slow
def test_a_compiling_grammar_blocks_neither_the_event_loop_nor_the_running_requests(
    async_llm: AsyncLLM, monkeypatch: pytest.MonkeyPatch
) -> None:
    compiler = async_llm.engine.grammar_compiler
    real_compile = compiler.compile
    started, release, returned = threading.Event(), threading.Event(), threading.Event()
    compile_threads: list[threading.Thread] = []

    def held_compile(params: StructuredOutputsParams) -> str:
        compile_threads.append(threading.current_thread())
        started.set()
        release.wait(HOLD_S)
        try:
            return real_compile(params)
        finally:
            returned.set()

    monkeypatch.setattr(compiler, "compile", held_compile)
    constrained = SamplingParams(temperature=0.0, max_tokens=8,
                                 structured_outputs=StructuredOutputsParams(regex="[ab]{2,4}"))
    free = SamplingParams(temperature=0.0, max_tokens=5, ignore_eos=True)

    async def main() -> tuple[list, list, bool]:
        async def stream(prompt: list[int], params: SamplingParams, request_id: str) -> list:
            return [o async for o in async_llm.generate({"prompt_token_ids": prompt}, params, request_id)]

        try:
            held = asyncio.create_task(stream([5, 6, 7], constrained, "constrained"))
            while not started.is_set():
                await asyncio.sleep(0.01)  # the loop runs while the grammar compiles
            others = await stream([8, 9, 10], free, "free")
            finished_while_compiling = not returned.is_set()
            release.set()
            return await held, others, finished_while_compiling
        finally:
            release.set()
            await async_llm.shutdown()

    loop_thread: list[threading.Thread] = []

    async def run() -> tuple[list, list, bool]:
        loop_thread.append(threading.current_thread())
        return await main()

    held, others, finished_while_compiling = asyncio.run(run())
    assert finished_while_compiling, "the unconstrained request waited for the grammar"
    assert len(others[-1].outputs[0].token_ids) == 5 and others[-1].finished
    assert compile_threads and compile_threads[0] is not loop_thread[0]
    assert held[-1].finished and re.fullmatch("[ab]{2,4}", held[-1].outputs[0].text)


def test_an_invalid_constraint_still_raises_value_error_before_any_output(async_llm: AsyncLLM) -> None:
    params = SamplingParams(max_tokens=4, structured_outputs=StructuredOutputsParams(regex="(unclosed"))

    async def main() -> None:
        try:
            async for _ in async_llm.generate({"prompt_token_ids": [5, 6]}, params, "bad-grammar"):
                raise AssertionError("an output came before the error")
        finally:
            await async_llm.shutdown()

    with pytest.raises(ValueError, match="constraint is invalid"):
        asyncio.run(main())
