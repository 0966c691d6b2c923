"""A client that disconnects mid-request aborts its request and frees its KV blocks,
streamed or not."""

from __future__ import annotations

import time

import httpx
import pytest
from server_harness import scrape_metrics

MAX_TOKENS = 200
FINISHED_BY_LENGTH = "accord:request_success_total[finished_reason=length]"
BODY = {"prompt": "A long story:", "max_tokens": MAX_TOKENS, "ignore_eos": True}


def wait_until_no_kv_blocks(http: httpx.Client) -> dict[str, float]:
    """Poll /metrics until no KV block is in use (10 s at most); the last scrape."""
    deadline = time.monotonic() + 10
    while (metrics := scrape_metrics(http))["accord:kv_cache_usage_perc"] > 0 and time.monotonic() < deadline:
        time.sleep(0.05)
    return metrics


def assert_aborted_and_freed(before: dict[str, float], after: dict[str, float]) -> None:
    assert after["accord:kv_cache_usage_perc"] == 0
    # Aborted, not run to its end: it never finished by length.
    assert after.get(FINISHED_BY_LENGTH, 0) == before.get(FINISHED_BY_LENGTH, 0)
    assert after["accord:generation_tokens_total"] - before["accord:generation_tokens_total"] < MAX_TOKENS


def test_disconnect_mid_stream_aborts_the_request_and_frees_every_kv_block(http: httpx.Client) -> None:
    before = scrape_metrics(http)
    with http.stream("POST", "/v1/completions", json={**BODY, "stream": True}) as response:
        assert next(response.iter_lines()).startswith("data: ")
        assert scrape_metrics(http)["accord:kv_cache_usage_perc"] > 0  # it holds blocks while streaming
    # Leaving the block closed the connection mid-stream.
    assert_aborted_and_freed(before, wait_until_no_kv_blocks(http))


def test_disconnect_before_a_whole_response_aborts_the_request_and_frees_every_kv_block(http: httpx.Client) -> None:
    before = scrape_metrics(http)
    with pytest.raises(httpx.ReadTimeout):  # the client gives up and closes the connection
        http.post("/v1/completions", json=BODY, timeout=0.5)
    assert_aborted_and_freed(before, wait_until_no_kv_blocks(http))
