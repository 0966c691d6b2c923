"""Many concurrent streaming requests all complete, each with correct usage."""

from __future__ import annotations

import asyncio

import openai
import pytest

from server_harness import API_KEY, ServerProcess

NUM_REQUESTS = 64
MAX_TOKENS = 4


async def stream_one(client: openai.AsyncOpenAI, index: int) -> tuple[int, int]:
    """Stream one completion; return (tokens streamed, usage.completion_tokens)."""
    stream = await client.completions.create(
        model="accord-demo-random", prompt=f"Request number {index} says", max_tokens=MAX_TOKENS, logprobs=0, stream=True,
        stream_options={"include_usage": True}, extra_body={"ignore_eos": True},
    )
    streamed, usage = 0, None
    async for chunk in stream:
        if chunk.choices:
            streamed += len(chunk.choices[0].logprobs.tokens)
        else:
            usage = chunk.usage
    return streamed, usage.completion_tokens


async def stream_all(url: str) -> list[tuple[int, int]]:
    async with openai.AsyncOpenAI(base_url=f"{url}/v1", api_key=API_KEY, max_retries=0, timeout=300) as client:
        return await asyncio.gather(*(stream_one(client, i) for i in range(NUM_REQUESTS)))


@pytest.mark.slow
def test_64_concurrent_streams_all_complete_with_correct_usage(server: ServerProcess) -> None:
    results = asyncio.run(stream_all(server.url))
    assert results == [(MAX_TOKENS, MAX_TOKENS)] * NUM_REQUESTS
