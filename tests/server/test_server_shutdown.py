"""SIGTERM shuts `accord serve` down gracefully: requests in flight finish, then the
process exits with status 0."""

from __future__ import annotations

import json
import threading
import time
from pathlib import Path

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families
from server_harness import ENGINE_FLAGS, ServerProcess

MAX_TOKENS = 24


def wait_until_admitted(server: ServerProcess, requests: int, timeout: float = 30.0) -> None:
    """Wait until the engine holds `requests` requests (running or waiting), read from
    /metrics: a request still connecting when SIGTERM lands is refused at the door,
    which is another test's case."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        families = text_string_to_metric_families(httpx.get(f"{server.url}/metrics", timeout=10).text)
        held = sum(
            sample.value for family in families if family.name in ("vllm:num_requests_running", "vllm:num_requests_waiting")
            for sample in family.samples
        )
        if held >= requests:
            return
        time.sleep(0.02)
    raise AssertionError(f"the server did not admit {requests} requests within {timeout} s")


@pytest.mark.slow
def test_sigterm_lets_the_request_in_flight_finish_then_exits_zero(demo_model: Path, cache_dir: Path) -> None:
    server = ServerProcess(*ENGINE_FLAGS, "--shutdown-timeout", "60", cache_dir=cache_dir)
    try:
        body = {"prompt": "Once upon a time", "max_tokens": MAX_TOKENS, "stream": True, "ignore_eos": True, "logprobs": 0}
        with httpx.stream("POST", f"{server.url}/v1/completions", json=body, timeout=60) as response:
            events = response.iter_lines()
            first = next(events)
            server.terminate()
            rest = [line for line in events if line]
        chunks = [json.loads(line.removeprefix("data: ")) for line in [first, *rest[:-1]]]
        assert rest[-1] == "data: [DONE]"
        assert sum(len(chunk["choices"][0]["logprobs"]["tokens"]) for chunk in chunks) == MAX_TOKENS
        assert chunks[-1]["choices"][0]["finish_reason"] == "length"
        assert server.process.wait(timeout=60) == 0
    finally:
        server.stop()


@pytest.mark.slow
def test_requests_that_outlive_a_short_drain_end_cleanly(demo_model: Path, cache_dir: Path) -> None:
    # A 50 ms drain against 240 tokens: even a fast host needs ten times that to decode
    # them, so both requests are still running when the drain ends.
    server = ServerProcess(*ENGINE_FLAGS, "--shutdown-timeout", "0.05", cache_dir=cache_dir)
    long = {"prompt": "Once upon a time", "max_tokens": 240, "ignore_eos": True}
    whole: dict[str, httpx.Response] = {}
    try:
        waiter = threading.Thread(
            target=lambda: whole.update(r=httpx.post(f"{server.url}/v1/completions", json=long, timeout=60))
        )
        with httpx.stream("POST", f"{server.url}/v1/completions", json={**long, "stream": True}, timeout=60) as response:
            events = response.iter_lines()
            assert next(events).startswith("data: ")
            waiter.start()
            wait_until_admitted(server, 2)  # the whole request is in flight too
            server.terminate()
            rest = [line for line in events if line]
        waiter.join(timeout=60)
        assert rest[-1] == "data: [DONE]"
        error = json.loads(rest[-2].removeprefix("data: "))["error"]
        assert error["code"] == "server_shutting_down"
        assert whole["r"].status_code == 503
        assert whole["r"].json()["error"]["code"] == "server_shutting_down"
        assert server.process.wait(timeout=60) == 0
        assert "Traceback" not in server.output()
    finally:
        server.stop()
