"""The prefill instance of the NIXL tests, run in a process of its own: AsyncLLM (the
server's engine loop, which keeps stepping while blocks wait for a reader) over an
engine with NixlConnector as kv_producer, answering its parent over a pipe."""

from __future__ import annotations

import asyncio
import itertools
from multiprocessing.connection import Connection

from accord import LLM
from accord.core.engine.async_llm import AsyncLLM
from accord.core.sampling_params import SamplingParams


async def _prefill(engine: AsyncLLM, prompt: str, request_id: str) -> dict | None:
    params = SamplingParams(temperature=0.0, max_tokens=1, ignore_eos=True,
                            extra_args={"kv_transfer_params": {"do_remote_decode": True}})
    async for output in engine.generate(prompt, params, request_id):
        last = output
    return last.kv_transfer_params


async def _serve(llm: LLM, conn: Connection) -> None:
    engine, ids = AsyncLLM(llm.llm_engine), itertools.count()
    block_manager = llm.llm_engine.scheduler.block_manager
    conn.send(block_manager.num_free_blocks)
    while True:
        if not conn.poll():
            await asyncio.sleep(0.005)
            continue
        command, *args = conn.recv()
        if command == "stop":
            await engine.shutdown()
            return
        if command == "free_blocks":
            conn.send(block_manager.num_free_blocks)
        elif command == "prefill":
            conn.send([await _prefill(engine, prompt, f"prefill-{next(ids)}") for prompt in args[0]])


def serve_prefill(model_dir: str, engine_args: dict, kv_transfer_config: dict, conn: Connection) -> None:
    """Answer ("prefill", prompts) with each prompt's kv_transfer_params, ("free_blocks",)
    with the free block count, ("stop",) by returning; send the free count once ready."""
    asyncio.run(_serve(LLM(model_dir, kv_transfer_config=kv_transfer_config, **engine_args), conn))
