"""A bounded load test (issue 13): 64 concurrent requests for a few seconds, some
malformed and some disconnecting mid-stream; every other stream finishes by length,
the KV cache empties and the server log holds no traceback."""

from __future__ import annotations

import asyncio
import json
import time

import httpx
from server_harness import API_KEY, ServerProcess, scrape_metrics

NUM_GOOD, NUM_MALFORMED, NUM_DISCONNECTING = 48, 8, 8
MALFORMED = [
    '{"prompt": ', '{"prompt": "x", "top_k": 2147483648}', '{"prompt": "x", "stop_token_ids": [5000], "min_tokens": 1}',
    '{"prompt": "a\\ud800"}', '{"prompt": [true]}', '{"prompt": "x", "max_tokens": 0}',
    '{"prompt": "x", "guided_regex": "(("}', '{"prompt": "x", "logit_bias": {"1": 1000}}',
]


async def good(client: httpx.AsyncClient, index: int) -> str | None:
    body = {"prompt": f"Story {index}:", "max_tokens": 16, "ignore_eos": True, "stream": True}
    finish_reason = None
    async with client.stream("POST", "/v1/completions", json=body) as response:
        assert response.status_code == 200
        async for line in response.aiter_lines():
            if line.startswith("data: {"):
                chunk = json.loads(line.removeprefix("data: "))
                assert "error" not in chunk, chunk
                finish_reason = chunk["choices"][0]["finish_reason"] or finish_reason
    return finish_reason


async def malformed(client: httpx.AsyncClient, body: str) -> int:
    response = await client.post("/v1/completions", content=body, headers={"Content-Type": "application/json"})
    return response.status_code


async def disconnecting(client: httpx.AsyncClient, index: int) -> None:
    body = {"prompt": f"Leaving {index}:", "max_tokens": 200, "ignore_eos": True, "stream": True}
    async with client.stream("POST", "/v1/completions", json=body) as response:
        async for line in response.aiter_lines():
            if line.startswith("data: "):
                return  # leaving the block drops the connection mid-stream


async def load(url: str) -> tuple[list, list]:
    limits = httpx.Limits(max_connections=NUM_GOOD + NUM_MALFORMED + NUM_DISCONNECTING)
    headers = {"Authorization": f"Bearer {API_KEY}"}
    async with httpx.AsyncClient(base_url=url, headers=headers, timeout=120, limits=limits) as client:
        goods = [good(client, i) for i in range(NUM_GOOD)]
        bads = [malformed(client, MALFORMED[i % len(MALFORMED)]) for i in range(NUM_MALFORMED)]
        leaving = [disconnecting(client, i) for i in range(NUM_DISCONNECTING)]
        results = await asyncio.gather(*goods, *bads, *leaving)
    return results[:NUM_GOOD], results[NUM_GOOD : NUM_GOOD + NUM_MALFORMED]


def test_64_concurrent_requests_with_bad_and_leaving_clients(server: ServerProcess, http: httpx.Client) -> None:
    finish_reasons, statuses = asyncio.run(load(server.url))
    assert finish_reasons == ["length"] * NUM_GOOD
    assert all(status == 400 for status in statuses), statuses
    deadline = time.monotonic() + 15
    while scrape_metrics(http)["vllm:kv_cache_usage_perc"] > 0 and time.monotonic() < deadline:
        time.sleep(0.1)
    metrics = scrape_metrics(http)
    assert metrics["vllm:kv_cache_usage_perc"] == 0 and metrics["vllm:num_requests_running"] == 0
    assert "Traceback" not in server.output()
