"""Every request whose client goes away is counted as an abort, the ones still waiting
for their first token too: 50 sockets closed while 1 request runs and 49 wait (held
there by --max-num-seqs 1) add 50 to request_success_total{finished_reason="abort"}."""

from __future__ import annotations

import json
import socket
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from server_harness import API_KEY, ENGINE_FLAGS, ServerProcess, scrape_metrics

ABORTS = "accord:request_success_total[finished_reason=abort]"
RUNNING, WAITING = "accord:num_requests_running", "accord:num_requests_waiting"
NUM_CLIENTS = 50
SETTLE_S = 60


@pytest.fixture(scope="module")
def one_at_a_time(cache_dir: Path) -> Iterator[ServerProcess]:
    """A server that runs one request at a time (the rest wait), with room for a long one."""
    server = ServerProcess(
        "--api-key", API_KEY, *ENGINE_FLAGS, "--max-num-seqs", "1", "--max-model-len", "2048", cache_dir=cache_dir
    )
    yield server
    server.stop()


def open_request(server: ServerProcess, stream: bool) -> socket.socket:
    """A connection that has sent a long completion request and reads nothing back."""
    body = json.dumps({"prompt": "A long story:", "max_tokens": 2000, "ignore_eos": True, "stream": stream}).encode()
    head = (
        f"POST /v1/completions HTTP/1.1\r\nHost: 127.0.0.1\r\nAuthorization: Bearer {API_KEY}\r\n"
        f"Content-Type: application/json\r\nContent-Length: {len(body)}\r\n\r\n"
    ).encode()
    connection = socket.create_connection(("127.0.0.1", server.port))
    connection.sendall(head + body)
    return connection


def wait_for_metrics(http: httpx.Client, condition, what: str) -> dict[str, float]:
    deadline = time.monotonic() + SETTLE_S
    while not condition(metrics := scrape_metrics(http)):
        assert time.monotonic() < deadline, f"timed out waiting for {what}: {metrics}"
        time.sleep(0.05)
    return metrics


@pytest.mark.slow
def test_closing_a_running_and_many_waiting_requests_counts_every_abort(one_at_a_time: ServerProcess) -> None:
    with httpx.Client(base_url=one_at_a_time.url, timeout=30) as http:
        before = scrape_metrics(http).get(ABORTS, 0)
        # Streamed and whole requests alike: both wait for their first token before answering.
        connections = [open_request(one_at_a_time, stream=False)]
        wait_for_metrics(http, lambda m: m[RUNNING] == 1, "the first request to run")
        connections += [open_request(one_at_a_time, stream=i % 2 == 0) for i in range(NUM_CLIENTS - 1)]
        wait_for_metrics(http, lambda m: m[WAITING] == NUM_CLIENTS - 1, "the others to wait")
        assert scrape_metrics(http)[RUNNING] == 1
        for connection in connections:
            connection.close()
        settled = wait_for_metrics(
            http, lambda m: m[RUNNING] == m[WAITING] == 0 and m.get(ABORTS, 0) - before >= NUM_CLIENTS,
            "every request to end",
        )
    assert settled[ABORTS] - before == NUM_CLIENTS
    assert settled["accord:kv_cache_usage_perc"] == 0
