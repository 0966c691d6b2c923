"""A client that disconnects mid-request aborts its request and frees its KV blocks,
streamed or not.

Each test disconnects once it sees, from the server's side, that its request runs; the
request asks for 2000 tokens, on a server of its own with the demo model's whole
context, so nearly all of them are still to come however fast the host is."""

from __future__ import annotations

import json
import socket
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from server_harness import API_KEY, ENGINE_FLAGS, ServerProcess, scrape_metrics

# Every test here runs a server of its own end to end.
pytestmark = pytest.mark.slow

MAX_TOKENS = 2000
FINISHED_BY_LENGTH = "vllm:request_success_total[finished_reason=length]"
BODY = {"prompt": "A long story:", "max_tokens": MAX_TOKENS, "ignore_eos": True}


@pytest.fixture(scope="module")
def server(demo_model: Path, cache_dir: Path) -> Iterator[ServerProcess]:
    """The demo model with its whole 2048-token context (the shared server has 256)."""
    process = ServerProcess("--api-key", API_KEY, *ENGINE_FLAGS, "--max-model-len", "2048", cache_dir=cache_dir)
    yield process
    process.stop()


@pytest.fixture(scope="module")
def http(server: ServerProcess) -> Iterator[httpx.Client]:
    """A plain HTTP client of this module's server, with the API key."""
    with httpx.Client(base_url=server.url, headers={"Authorization": f"Bearer {API_KEY}"}, timeout=60) as client:
        yield client


def wait_until_no_kv_blocks(http: httpx.Client) -> dict[str, float]:
    """Poll /metrics until no KV block is in use (10 s at most); the last scrape."""
    deadline = time.monotonic() + 10
    while (metrics := scrape_metrics(http))["vllm:kv_cache_usage_perc"] > 0 and time.monotonic() < deadline:
        time.sleep(0.05)
    return metrics


def assert_aborted_and_freed(before: dict[str, float], after: dict[str, float]) -> None:
    assert after["vllm:kv_cache_usage_perc"] == 0
    # Aborted, not run to its end: it never finished by length.
    assert after.get(FINISHED_BY_LENGTH, 0) == before.get(FINISHED_BY_LENGTH, 0)
    assert after["vllm:generation_tokens_total"] - before["vllm:generation_tokens_total"] < MAX_TOKENS


def test_disconnect_mid_stream_aborts_the_request_and_frees_every_kv_block(http: httpx.Client) -> None:
    before = scrape_metrics(http)
    with http.stream("POST", "/v1/completions", json={**BODY, "stream": True}) as response:
        assert next(response.iter_lines()).startswith("data: ")
        # It holds blocks while streaming; the gauge is the scheduler's at its last step,
        # which may predate this request's first one, so wait for a later step's.
        wait_until_holding_kv_blocks(http)
    # Leaving the block closed the connection mid-stream.
    assert_aborted_and_freed(before, wait_until_no_kv_blocks(http))


def test_disconnect_before_a_whole_response_aborts_the_request_and_frees_every_kv_block(server, http: httpx.Client) -> None:
    # The client closes the connection once the server holds the request's KV blocks, which the
    # test sees on /metrics: the disconnect lands while the request runs on any host, with
    # nearly all of its 200 tokens still to come, rather than after a client timeout that a
    # fast host outruns.
    before = scrape_metrics(http)
    body = json.dumps(BODY).encode()
    head = (
        "POST /v1/completions HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
        f"Authorization: Bearer {API_KEY}\r\nContent-Length: {len(body)}\r\n\r\n"
    )
    with socket.create_connection(("127.0.0.1", server.port)) as client:
        client.sendall(head.encode() + body)
        wait_until_holding_kv_blocks(http)
    assert_aborted_and_freed(before, wait_until_no_kv_blocks(http))


def wait_until_holding_kv_blocks(http: httpx.Client) -> None:
    """Poll /metrics until some KV block is in use (10 s at most)."""
    deadline = time.monotonic() + 10
    while scrape_metrics(http)["vllm:kv_cache_usage_perc"] == 0:
        assert time.monotonic() < deadline, "the request never started"
        time.sleep(0.005)
