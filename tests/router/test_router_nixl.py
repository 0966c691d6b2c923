"""`accord router` in PD mode over two `accord serve` processes joined by NixlConnector
(UCX over loopback TCP): the router's answer is the prefill instance's own answer to
the same request, the decode instance reads all prompt tokens but the last, and the
prefill instance frees the blocks it kept once they are read; a client that leaves a
non-streamed request while it decodes leaves no block held on either side."""

from __future__ import annotations

import json
import socket
import time
from collections.abc import Callable, Iterator
from urllib.parse import urlsplit

import httpx
import pytest
from server_harness import ENGINE_FLAGS, ServerProcess, free_port, scrape_metrics

pytestmark = pytest.mark.slow
pytest.importorskip("nixl_cu12", reason="NixlConnector needs NIXL: pip install --no-deps nixl-cu12")

GREEDY = {"max_tokens": 8, "temperature": 0.0, "ignore_eos": True}
#: Far more tokens than decode before the client leaves (the demo model's context is 256).
LONG_MAX_TOKENS = 200
WAIT_S = 60.0
PROMPT = "Once upon a time in a quiet harbour town, the fishing boats came home at dusk and"


def _nixl(role: str) -> str:
    return json.dumps({"kv_connector": "NixlConnector", "kv_role": role, "kv_port": free_port()})


@pytest.fixture
def nixl_servers(cache_dir, monkeypatch: pytest.MonkeyPatch) -> Iterator[tuple[ServerProcess, ServerProcess]]:
    """A kv_producer and a kv_consumer instance (the servers inherit the UCX settings)."""
    monkeypatch.setenv("UCX_TLS", "tcp")
    monkeypatch.setenv("UCX_NET_DEVICES", "lo")
    prefill = ServerProcess(*ENGINE_FLAGS, "--kv-transfer-config", _nixl("kv_producer"), cache_dir=cache_dir)
    try:
        decode = ServerProcess(*ENGINE_FLAGS, "--enable-prompt-tokens-details",
                               "--kv-transfer-config", _nixl("kv_consumer"), cache_dir=cache_dir)
        yield prefill, decode
        decode.stop()
    finally:
        prefill.stop()


def _complete(url: str, prompt: str) -> dict:
    response = httpx.post(f"{url}/v1/completions", json={**GREEDY, "prompt": prompt}, timeout=60)
    assert response.status_code == 200, response.text
    return response.json()


def _metric(url: str, name: str) -> float:
    with httpx.Client(base_url=url) as client:
        return scrape_metrics(client).get(name, 0.0)


def _kv_usage(url: str) -> float:
    return _metric(url, "vllm:kv_cache_usage_perc")


def _wait_for(condition: Callable[[], bool], what: str) -> None:
    deadline = time.monotonic() + WAIT_S
    while not condition():
        assert time.monotonic() < deadline, f"{what} did not happen within {WAIT_S} s"
        time.sleep(0.05)


def _post_then_leave(url: str, body: dict, leave_once: Callable[[], bool]) -> None:
    """POST a non-streamed completion on a bare connection and close it, unanswered,
    once `leave_once()` holds."""
    address = urlsplit(url)
    payload = json.dumps(body).encode()
    head = (f"POST /v1/completions HTTP/1.1\r\nhost: {address.netloc}\r\ncontent-type: application/json\r\n"
            f"content-length: {len(payload)}\r\n\r\n").encode()
    with socket.create_connection((address.hostname, address.port)) as connection:
        connection.sendall(head + payload)
        _wait_for(leave_once, "the condition to leave on")


def test_pd_mode_over_nixl_gives_the_prefill_instances_text_and_frees_the_kept_blocks(
    nixl_servers: tuple[ServerProcess, ServerProcess], start_router
) -> None:
    prefill, decode = nixl_servers
    router = start_router("--prefill", prefill.url, "--decode", decode.url)
    expected = _complete(prefill.url, PROMPT)["choices"][0]["text"]
    answer = _complete(router.url, PROMPT)
    assert answer["choices"][0]["text"] == expected
    usage = answer["usage"]
    assert usage["prompt_tokens_details"]["cached_tokens"] == usage["prompt_tokens"] - 1
    # The read's notification reaches the prefill instance's engine loop, which frees the blocks.
    deadline = time.monotonic() + 20
    while _kv_usage(prefill.url) > 0 and time.monotonic() < deadline:
        time.sleep(0.1)
    assert _kv_usage(prefill.url) == 0
    assert _kv_usage(decode.url) == 0


def test_a_client_leaving_a_non_streamed_pd_request_while_it_decodes_frees_both_sides_blocks(
    nixl_servers: tuple[ServerProcess, ServerProcess], start_router
) -> None:
    prefill, decode = nixl_servers
    router = start_router("--prefill", prefill.url, "--decode", decode.url)
    before = _metric(decode.url, "vllm:generation_tokens_total")
    _post_then_leave(router.url, {**GREEDY, "prompt": "leave while it decodes: " + PROMPT, "max_tokens": LONG_MAX_TOKENS},
                     lambda: _metric(decode.url, "vllm:generation_tokens_total") > before)
    _wait_for(lambda: not _metric(decode.url, "vllm:num_requests_running"), "the decode instance's abort")
    # Cut short, not decoded to its end for nobody; and nothing held on either side (the
    # prefill instance's abort_timeout_s is 480 s).
    assert _metric(decode.url, "vllm:generation_tokens_total") - before < LONG_MAX_TOKENS
    _wait_for(lambda: _kv_usage(prefill.url) == 0, "the prefill instance freeing its kept blocks")
    assert _kv_usage(decode.url) == 0
