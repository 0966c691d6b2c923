"""`accord router` in front of real `accord serve` processes: PD mode (prefill on one
instance, decode on the other with the returned kv_transfer_params) gives the text one
instance gives and the decode instance loads the prompt; round-robin spreads requests;
a dead instance is retried before anything was streamed and ends a stream cleanly after;
affinity keeps a session on one instance; a client that leaves mid-stream and a decode
instance killed mid-stream leave no KV block held (the instances' kv_cache_usage_perc);
with no decode instance in rotation PD mode answers 503 without a prefill."""

from __future__ import annotations

import json
import time

import httpx
import pytest
from server_harness import free_port, scrape_metrics

pytestmark = pytest.mark.slow

PROMPT = "Once upon a time in a quiet harbour town, the fishing boats came home at dusk and"
GREEDY = {"prompt": PROMPT, "max_tokens": 8, "temperature": 0.0, "ignore_eos": True}
#: A stream far longer than the moment a test acts at (its first token): the demo
#: model's context (256) less the prompts'.
LONG_MAX_TOKENS = 200
IDLE_TIMEOUT_S = 60.0


def _complete(url: str, **body) -> dict:
    response = httpx.post(f"{url}/v1/completions", json={**GREEDY, **body}, timeout=60)
    assert response.status_code == 200, response.text
    return response.json()


def _generated(url: str) -> float:
    with httpx.Client(base_url=url) as client:
        return scrape_metrics(client).get("vllm:generation_tokens_total", 0.0)


def _stream_events(url: str, **body) -> list[dict]:
    events = []
    with httpx.stream("POST", f"{url}/v1/completions", json={**GREEDY, "stream": True, **body}, timeout=60) as response:
        assert response.status_code == 200
        for line in response.iter_lines():
            if line.startswith("data: {"):
                events.append(json.loads(line[6:]))
    return events


def test_pd_mode_gives_one_instances_text_and_the_decode_instance_loads_the_prompt(
    prefill_server, decode_server, start_router
) -> None:
    router = start_router("--prefill", prefill_server.url, "--decode", decode_server.url)
    expected = _complete(prefill_server.url, prompt=PROMPT + " one")["choices"][0]["text"]
    prefill_before = _generated(prefill_server.url)
    answer = _complete(router.url, prompt=PROMPT + " one")
    assert answer["choices"][0]["text"] == expected
    # The prefill instance sampled its one token; the decode instance loaded all but the last prompt token.
    assert _generated(prefill_server.url) - prefill_before == 1
    usage = answer["usage"]
    assert usage["prompt_tokens_details"]["cached_tokens"] == usage["prompt_tokens"] - 1
    streamed = _stream_events(router.url, prompt=PROMPT + " two")
    assert "".join(e["choices"][0]["text"] for e in streamed if e["choices"]) == (
        _complete(prefill_server.url, prompt=PROMPT + " two")["choices"][0]["text"]
    )


def test_pd_mode_without_a_prefill_instance_decodes_with_a_local_prefill(
    prefill_server, decode_server, dying_upstream, start_router
) -> None:
    dead = dying_upstream(streams_first_event=False)
    router = start_router("--prefill", dead.url, "--decode", decode_server.url)
    prompt = "A prompt no other test sends, so no cache holds any of it: " + PROMPT
    answer = _complete(router.url, prompt=prompt)
    assert dead.generation_requests == 1
    assert answer["choices"][0]["text"] == _complete(prefill_server.url, prompt=prompt)["choices"][0]["text"]
    assert answer["usage"]["prompt_tokens_details"]["cached_tokens"] == 0


def test_round_robin_alternates_between_instances(prefill_server, decode_server, start_router) -> None:
    router = start_router("--backend", prefill_server.url, "--backend", decode_server.url)
    before = [_generated(prefill_server.url), _generated(decode_server.url)]
    for n in range(4):
        _complete(router.url, prompt=f"request {n}", max_tokens=1)
    after = [_generated(prefill_server.url), _generated(decode_server.url)]
    assert [a - b for a, b in zip(after, before)] == [2, 2]


def test_a_dead_instance_is_retried_on_the_next_before_anything_was_streamed(
    prefill_server, dying_upstream, start_router
) -> None:
    dead = dying_upstream(streams_first_event=False)
    router = start_router("--backend", dead.url, "--backend", prefill_server.url, "--health-interval", "3600")
    texts = [_complete(router.url, prompt="retry me", max_tokens=2)["choices"][0]["text"] for _ in range(2)]
    streamed = _stream_events(router.url, prompt="retry me", max_tokens=2)
    assert dead.generation_requests == 1  # tried once, then out of rotation
    assert texts[0] == texts[1] == "".join(e["choices"][0]["text"] for e in streamed if e["choices"])
    with httpx.Client(base_url=router.url) as client:
        metrics = scrape_metrics(client)
    assert metrics[f"accord_router_instance_healthy[instance={dead.url}][role=mixed]"] == 0
    assert metrics[f"accord_router_instance_failures_total[instance={dead.url}][role=mixed]"] == 1


def test_an_instance_lost_mid_stream_ends_the_stream_with_an_error_event(dying_upstream, start_router) -> None:
    dying = dying_upstream(streams_first_event=True)
    router = start_router("--backend", dying.url, "--health-interval", "3600")
    events = _stream_events(router.url)
    assert events[0] == {"choices": [{"index": 0, "text": "A"}]}
    assert events[-1]["error"]["code"] == 502 and dying.url in events[-1]["error"]["message"]
    assert dying.generation_requests == 1  # no retry once bytes reached the client


def test_no_instance_left_is_a_503_with_an_openai_body(dying_upstream, start_router) -> None:
    dead = dying_upstream(streams_first_event=False)
    router = start_router("--backend", dead.url, "--health-interval", "3600")
    response = httpx.post(f"{router.url}/v1/completions", json=GREEDY, timeout=60)
    assert response.status_code == 503
    assert response.json()["error"]["type"] == "service_unavailable_error"
    assert httpx.get(f"{router.url}/health").status_code == 503


def test_pd_mode_with_no_decode_instance_in_rotation_is_a_503_and_prefills_nothing(
    prefill_server, start_router
) -> None:
    gone = f"http://127.0.0.1:{free_port()}"  # nothing listens there
    router = start_router("--prefill", prefill_server.url, "--decode", gone)
    deadline = time.monotonic() + IDLE_TIMEOUT_S
    while httpx.get(f"{router.url}/health").status_code != 503:  # the first health check has run
        assert time.monotonic() < deadline, "the router never took the dead decode instance out of rotation"
        time.sleep(0.05)
    before = _generated(prefill_server.url)
    response = httpx.post(f"{router.url}/v1/completions", json=GREEDY, timeout=60)
    assert response.status_code == 503 and gone in response.json()["error"]["message"]
    # A prefill would have kept its blocks for a decode leg that cannot happen.
    assert _generated(prefill_server.url) == before


def _metric(url: str, name: str) -> float:
    with httpx.Client(base_url=url) as client:
        return scrape_metrics(client).get(name, 0.0)


def _wait_until_idle(url: str) -> None:
    """Return once the instance holds no running or waiting request (an abort is
    handled by its engine loop, after the connection closed)."""
    deadline = time.monotonic() + IDLE_TIMEOUT_S
    while _metric(url, "vllm:num_requests_running") or _metric(url, "vllm:num_requests_waiting"):
        assert time.monotonic() < deadline, f"{url} still runs a request after {IDLE_TIMEOUT_S} s"
        time.sleep(0.05)


def _stream_until_first_token(url: str, on_first_token, **body) -> list[dict]:
    """Stream a long completion, call `on_first_token()` once its first event arrived,
    then read on to the end: every event."""
    events: list[dict] = []
    long = {**GREEDY, "max_tokens": LONG_MAX_TOKENS, "stream": True, **body}
    with httpx.stream("POST", f"{url}/v1/completions", json=long, timeout=60) as response:
        assert response.status_code == 200
        for line in response.iter_lines():
            if line.startswith("data: {"):
                events.append(json.loads(line[6:]))
                if len(events) == 1 and on_first_token() is False:
                    break
    return events


def test_affinity_keeps_a_session_on_one_real_instance(prefill_server, decode_server, start_router) -> None:
    router = start_router("--backend", prefill_server.url, "--backend", decode_server.url, "--policy", "affinity")
    urls = (prefill_server.url, decode_server.url)
    before = [_generated(url) for url in urls]
    for turn in range(4):  # a different prompt each turn: the session id alone decides
        _complete(router.url, prompt=f"turn {turn}: tell me more", max_tokens=1, session_id="session-7")
    assert sorted(_generated(url) - start for url, start in zip(urls, before)) == [0, 4]


def test_a_client_leaving_mid_stream_frees_the_decode_instances_blocks(
    prefill_server, decode_server, start_router
) -> None:
    router = start_router("--prefill", prefill_server.url, "--decode", decode_server.url)
    before = _generated(decode_server.url)
    _stream_until_first_token(router.url, lambda: False, prompt="leave after one token: " + PROMPT)
    _wait_until_idle(decode_server.url)
    # The request was cut short (not run to its end), and every block it held is free.
    assert _generated(decode_server.url) - before < LONG_MAX_TOKENS
    assert _metric(decode_server.url, "vllm:kv_cache_usage_perc") == 0.0
    assert _metric(prefill_server.url, "vllm:kv_cache_usage_perc") == 0.0


def test_a_decode_instance_killed_mid_stream_fails_its_request_cleanly_through_the_router(
    prefill_server, doomed_decode_server, start_router
) -> None:
    doomed = doomed_decode_server
    router = start_router("--prefill", prefill_server.url, "--decode", doomed.url, "--health-interval", "3600")
    events = _stream_until_first_token(router.url, doomed.process.kill, prompt="killed mid-stream: " + PROMPT)
    tokens, error = events[:-1], events[-1]
    assert tokens and all(choice["finish_reason"] is None for event in tokens for choice in event["choices"])
    assert error["error"]["code"] == 502 and doomed.url in error["error"]["message"]
    # The prefill instance finished its part and holds no block for the lost request.
    _wait_until_idle(prefill_server.url)
    assert _metric(prefill_server.url, "vllm:kv_cache_usage_perc") == 0.0
    with httpx.Client(base_url=router.url) as client:
        metrics = scrape_metrics(client)
    assert metrics[f"accord_router_instance_healthy[instance={doomed.url}][role=decode]"] == 0
