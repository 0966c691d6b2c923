"""`accord router` in PD mode over two `accord serve` processes joined by NixlConnector
(UCX over loopback TCP): the router's answer is the prefill instance's own answer to
the same request, the decode instance reads all prompt tokens but the last, and the
prefill instance frees the blocks it kept once they are read."""

from __future__ import annotations

import json
import time
from collections.abc import Iterator

import httpx
import pytest
from server_harness import ENGINE_FLAGS, ServerProcess, free_port, scrape_metrics

pytestmark = pytest.mark.slow
pytest.importorskip("nixl_cu12", reason="NixlConnector needs NIXL: pip install --no-deps nixl-cu12")

GREEDY = {"max_tokens": 8, "temperature": 0.0, "ignore_eos": True}
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


def _kv_usage(url: str) -> float:
    with httpx.Client(base_url=url) as client:
        return scrape_metrics(client)["vllm:kv_cache_usage_perc"]


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
