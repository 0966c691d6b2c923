"""Admission and failure isolation, on the app over a stub engine (so the timing is
exact): past --max-waiting-requests a request gets 429, and an engine failure on one
request fails that request only."""

from __future__ import annotations

import asyncio
import json
import threading
from collections.abc import AsyncIterator
from dataclasses import dataclass

import httpx
import pytest

from accord.core.outputs import CompletionOutput, RequestOutput
from accord.core.sampling_params import SamplingParams
from accord.core.stats import EngineStats
from accord.server.app import create_app
from accord.server.options import ServerOptions
from accord.server.serving import ServedModel

FAILING_TOKEN, FAILING_LATE_TOKEN = 13, 14
MODEL = ServedModel(name="stub", root="/nowhere", max_model_len=64, vocab_size=100)


@dataclass(frozen=True)
class StubTokens:
    """What Tokenizer.tokenize gives the server: a length and the ids."""

    ids: list[int]

    def __len__(self) -> int:
        return len(self.ids)


class StubTokenizer:
    """Characters are tokens; records the threads that tokenise."""

    chat_template = None

    def __init__(self) -> None:
        self.threads: list[threading.Thread] = []

    def added_tokens(self, special_only: bool = False) -> dict[str, int]:
        return {}

    def tokenize(self, text: str, add_special_tokens: bool = True) -> StubTokens:
        self.threads.append(threading.current_thread())
        return StubTokens([ord(char) % 100 for char in text])

    def apply_chat_template(self, messages: list[dict], add_generation_prompt: bool = True, **options) -> str:
        return "".join(message["content"] for message in messages)

    def decode(self, token_ids: list[int], skip_special_tokens: bool = True) -> str:
        return "".join(chr(token) for token in token_ids)


class StubEngine:
    """Just enough of AsyncLLM: it holds every request until `release` is set, then
    answers one token. A prompt starting with FAILING_TOKEN fails at once, one
    starting with FAILING_LATE_TOKEN after its first token."""

    max_model_len = MODEL.max_model_len
    num_allocated_blocks = 0

    def __init__(self) -> None:
        self.tokenizer = StubTokenizer()
        self.started = asyncio.Event()
        self.release = asyncio.Event()

    async def generate(
        self, prompt: dict, params: SamplingParams, request_id: str, priority: int = 0
    ) -> AsyncIterator[RequestOutput]:
        token_ids = prompt["prompt_token_ids"]
        if token_ids[0] == FAILING_TOKEN:
            raise RuntimeError("the kernel failed")
        self.started.set()
        await self.release.wait()
        fails_late = token_ids[0] == FAILING_LATE_TOKEN
        sample = CompletionOutput(
            index=0, text="A", token_ids=[65], cumulative_logprob=None, logprobs=None,
            finish_reason=None if fails_late else "length",
        )
        yield RequestOutput(request_id, None, token_ids, None, [sample], finished=not fails_late)
        raise RuntimeError("the kernel failed late")

    async def abort(self, request_id: str) -> None:
        pass

    def get_stats(self) -> EngineStats:
        return EngineStats()

    def get_replica_stats(self) -> list[EngineStats]:
        return [EngineStats()]

    async def shutdown(self) -> None:
        pass


def client_for(engine: StubEngine, **options) -> httpx.AsyncClient:
    app = create_app(engine, MODEL, ServerOptions(**options))
    return httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://stub")


def test_a_request_past_max_waiting_requests_gets_429_while_the_waiting_one_completes() -> None:
    async def scenario() -> tuple[httpx.Response, httpx.Response]:
        engine = StubEngine()
        async with client_for(engine, max_waiting_requests=1) as client:
            waiting = asyncio.create_task(client.post("/v1/completions", json={"prompt": "a"}))
            await asyncio.wait_for(engine.started.wait(), timeout=10)
            refused = await client.post("/v1/completions", json={"prompt": "b"})
            engine.release.set()
            return refused, await waiting

    refused, waited = asyncio.run(scenario())
    assert refused.status_code == 429
    assert refused.json()["error"]["code"] == "too_many_waiting_requests"
    assert waited.status_code == 200 and waited.json()["choices"][0]["text"] == "A"


def test_an_engine_failure_fails_that_request_and_the_next_one_succeeds() -> None:
    async def scenario() -> tuple[httpx.Response, httpx.Response]:
        engine = StubEngine()
        engine.release.set()
        async with client_for(engine) as client:
            failed = await client.post("/v1/completions", json={"prompt": [FAILING_TOKEN]})
            return failed, await client.post("/v1/completions", json={"prompt": "a"})

    failed, served = asyncio.run(scenario())
    assert failed.status_code == 500
    # The cause is logged, never sent: exception text can name internals.
    assert failed.json()["error"]["code"] == "engine_error"
    assert "the kernel failed" not in failed.text
    assert served.status_code == 200


def test_an_engine_failure_mid_stream_ends_the_stream_with_an_error_event() -> None:
    async def scenario() -> list[str]:
        engine = StubEngine()
        engine.release.set()
        async with client_for(engine) as client:
            response = await client.post("/v1/completions", json={"prompt": [FAILING_LATE_TOKEN], "stream": True})
            assert response.status_code == 200
            return [line for line in response.text.splitlines() if line]

    first, error, done = asyncio.run(scenario())
    assert json.loads(first.removeprefix("data: "))["choices"][0]["text"] == "A"
    assert json.loads(error.removeprefix("data: "))["error"]["code"] == "engine_error"
    assert "the kernel failed late" not in error
    assert done == "data: [DONE]"


def test_a_request_that_could_never_be_admitted_gets_400_not_429() -> None:
    async def scenario() -> httpx.Response:
        engine = StubEngine()
        engine.release.set()
        async with client_for(engine, max_waiting_requests=2) as client:
            return await client.post("/v1/completions", json={"prompt": ["a", "b", "c"]})

    response = asyncio.run(scenario())
    assert response.status_code == 400 and response.json()["error"]["code"] == "too_many_prompts"


def test_429_says_when_to_retry_and_is_counted() -> None:
    async def scenario() -> tuple[httpx.Response, str]:
        engine = StubEngine()
        async with client_for(engine, max_waiting_requests=1) as client:
            waiting = asyncio.create_task(client.post("/v1/completions", json={"prompt": "a"}))
            await asyncio.wait_for(engine.started.wait(), timeout=10)
            refused = await client.post("/v1/completions", json={"prompt": "b"})
            engine.release.set()
            await waiting
            return refused, (await client.get("/metrics")).text

    refused, metrics = asyncio.run(scenario())
    assert refused.status_code == 429 and int(refused.headers["retry-after"]) >= 1
    assert 'vllm:admission_rejections_total{model_name="stub",reason="too_many_waiting_requests"} 1.0' in metrics


def test_prompts_and_chat_templates_are_tokenised_off_the_event_loop() -> None:
    async def scenario() -> list[threading.Thread]:
        engine = StubEngine()
        engine.release.set()
        async with client_for(engine) as client:
            assert (await client.post("/v1/completions", json={"prompt": "a"})).status_code == 200
            chat = {"messages": [{"role": "user", "content": "b"}]}
            assert (await client.post("/v1/chat/completions", json=chat)).status_code == 200
            assert (await client.post("/tokenize", json={"prompt": "c"})).status_code == 200
        return engine.tokenizer.threads

    threads = asyncio.run(scenario())  # the event loop runs in this (the main) thread
    assert len(threads) == 3 and threading.main_thread() not in threads


@pytest.mark.parametrize("path", ["/v1/models", "/proxy/v1/models"])
def test_the_api_key_guards_routes_under_the_root_path_too(path: str) -> None:
    async def scenario() -> tuple[int, int]:
        async with client_for(StubEngine(), api_keys=("k1", "k2"), root_path="/proxy") as client:
            refused = await client.get(path)
            allowed = await client.get(path, headers={"Authorization": "Bearer k2"})
            return refused.status_code, allowed.status_code

    assert asyncio.run(scenario()) == (401, 200)
