"""One streamed request to an OpenAI-compatible endpoint, timed per token on the client:
`/v1/completions` (`--backend openai`) or `/v1/chat/completions` (`openai-chat`).

httpx is the HTTP client: accord already depends on it for its tests, it streams with
HTTP keep-alive from one connection pool, and `httpx.MockTransport` lets the tests feed
a scripted stream through the very code that parses a real one. The client's own cost
per token is measured against a stub server (benchmarks/bench_client_overhead.py)."""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import httpx

from .datasets import SampleRequest

#: The request shapes `--backend` takes (vLLM's names for them).
BACKENDS = ("openai", "openai-chat")
#: Each backend's default `--endpoint`.
DEFAULT_ENDPOINTS = {"openai": "/v1/completions", "openai-chat": "/v1/chat/completions"}


@dataclass(frozen=True)
class RequestSettings:
    """What every request of a run shares: the backend's shape, the URL, the model name,
    and the body fields beyond the prompt and its length."""

    backend: str
    api_url: str
    model: str
    ignore_eos: bool = False
    #: Extra body fields (temperature and the like, then --extra-body), sent as given.
    extra_body: dict[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if self.backend not in BACKENDS:
            raise ValueError(f"unknown --backend {self.backend!r}: choose one of {', '.join(BACKENDS)}")

    def body(self, request: SampleRequest) -> dict[str, Any]:
        """The JSON body for `request`, streaming, with the usage chunk asked for."""
        if self.backend == "openai":
            body: dict[str, Any] = {"prompt": request.prompt, "max_tokens": request.expected_output_len}
        else:
            body = {
                "messages": [{"role": "user", "content": request.prompt}],
                "max_completion_tokens": request.expected_output_len,
            }
        body |= {"model": self.model, "stream": True, "stream_options": {"include_usage": True}}
        if self.ignore_eos:
            body["ignore_eos"] = True
        return body | self.extra_body


@dataclass
class RequestOutcome:
    """What the client saw of one request: times in seconds from `start_time` (the
    clock's reading when the request was sent), the text, and the token counts the
    server's usage chunk gave (None when it gave none)."""

    prompt_len: int
    start_time: float = 0.0
    success: bool = False
    ttft: float = 0.0
    #: Gaps between successive chunks that carried text, after the first.
    itl: list[float] = field(default_factory=list)
    latency: float = 0.0
    generated_text: str = ""
    usage_prompt_tokens: int | None = None
    usage_completion_tokens: int | None = None
    error: str = ""


def chunk_tokens(backend: str, chunk: dict[str, Any]) -> str | None:
    """The generated text of a chunk that carries tokens, None for one that carries none
    (usage only; a chat stream's opening role-only delta). A completions chunk with a
    choice carries tokens even when their text is "" (a character split across tokens,
    a special token), as vLLM's client counts it; a chat delta counts when it has text."""
    choices = chunk.get("choices") or []
    if not choices:
        return None
    if backend == "openai":
        return choices[0].get("text") or ""
    delta = choices[0].get("delta") or {}
    text = (delta.get("content") or "") + (delta.get("reasoning_content") or "")
    return text or None


async def send_request(
    http: httpx.AsyncClient,
    settings: RequestSettings,
    request: SampleRequest,
    clock: Callable[[], float] = time.perf_counter,
) -> RequestOutcome:
    """Send `request` and read its stream to the end, timing each chunk with `clock`
    as it is read. A failure (a status other than 200, a broken stream) is an outcome
    with `success` False and the reason, never an exception."""
    outcome = RequestOutcome(prompt_len=request.prompt_len)
    pieces: list[str] = []
    outcome.start_time = last = clock()
    try:
        async with http.stream("POST", settings.api_url, json=settings.body(request)) as response:
            if response.status_code != 200:
                outcome.error = f"HTTP {response.status_code}: {(await response.aread()).decode(errors='replace')[:500]}"
                return outcome
            async for line in response.aiter_lines():
                if not line.startswith("data:"):
                    continue  # blank separators and SSE comments
                data = line[5:].strip()
                if data == "[DONE]":
                    break
                chunk = json.loads(data)
                now = clock()
                if "error" in chunk:
                    outcome.error = f"error in the stream: {json.dumps(chunk['error'])[:500]}"
                    return outcome
                if usage := chunk.get("usage"):
                    outcome.usage_prompt_tokens = usage.get("prompt_tokens")
                    outcome.usage_completion_tokens = usage.get("completion_tokens")
                if (text := chunk_tokens(settings.backend, chunk)) is not None:
                    if not pieces:
                        outcome.ttft = now - outcome.start_time
                    else:
                        outcome.itl.append(now - last)
                    pieces.append(text)
                    last = now
        outcome.latency = clock() - outcome.start_time
    except (httpx.HTTPError, json.JSONDecodeError) as error:
        outcome.error = f"{type(error).__name__}: {error}"
        return outcome
    outcome.generated_text = "".join(pieces)
    outcome.success = bool(pieces)
    if not outcome.success:
        outcome.error = "the stream ended without a token"
    return outcome
