"""One streamed request to an OpenAI-compatible endpoint, timed per token on the client:
`/v1/completions` (`--backend openai`) or `/v1/chat/completions` (`openai-chat`). The
server-sent events are split and timed here, over any `HttpSession` (aiohttp's in a run,
a scripted one in the tests)."""

from __future__ import annotations

import json
import time
from collections.abc import AsyncIterator, Callable
from typing import Any

from .datasets import SampleRequest
from .http_session import TRANSPORT_ERRORS, HttpSession
from .request_types import RequestOutcome, RequestSettings

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


async def events(chunks: AsyncIterator[bytes]) -> AsyncIterator[str]:
    """The `data:` payloads of a server-sent event stream, each as soon as its line is
    whole (blank separators and comments dropped)."""
    pending = b""
    async for piece in chunks:
        pending += piece
        *lines, pending = pending.split(b"\n")
        for line in lines:
            if line.startswith(b"data:"):
                yield line[5:].strip().decode()
    if pending.startswith(b"data:"):
        yield pending[5:].strip().decode()


async def send_request(
    http: HttpSession,
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
        async with http.stream(settings.api_url, settings.body(request)) as response:
            if response.status != 200:
                text = b"".join([piece async for piece in response.chunks()]).decode(errors="replace")
                outcome.error = f"HTTP {response.status}: {text[:500]}"
                return outcome
            async for data in events(response.chunks()):
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
    except (*TRANSPORT_ERRORS, json.JSONDecodeError) as error:
        outcome.error = f"{type(error).__name__}: {error}"
        return outcome
    outcome.generated_text = "".join(pieces)
    outcome.success = bool(pieces)
    if not outcome.success:
        outcome.error = "the stream ended without a token"
    return outcome
