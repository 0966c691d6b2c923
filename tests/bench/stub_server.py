"""A scripted OpenAI streaming server for the bench serve tests, as an `HttpSession`
(the client's view of HTTP): each request's prompt names its script entry, and the
stream advances a fake clock by the scripted time before each chunk, so the client's
readings are exactly the script's."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass, field


@dataclass(frozen=True)
class ScriptedRequest:
    """One scripted answer: seconds to the first chunk, the gaps before each later
    chunk, the usage the server reports (None: no usage chunk), or an HTTP error."""

    ttft: float
    gaps: tuple[float, ...]
    usage_completion_tokens: int | None = None
    usage_prompt_tokens: int | None = None
    status: int = 200

    @property
    def chunks(self) -> int:
        return 1 + len(self.gaps)


@dataclass
class FakeClock:
    """Time that passes only when the stub says so."""

    now: float = 100.0

    def __call__(self) -> float:
        return self.now


@dataclass
class ScriptedResponse:
    """One answer as the client reads it: a status and the body's pieces."""

    status: int
    pieces: AsyncIterator[bytes]

    def chunks(self) -> AsyncIterator[bytes]:
        return self.pieces


async def _once(data: bytes) -> AsyncIterator[bytes]:
    yield data


@dataclass
class ScriptedServer:
    """The session: `script[i]` answers the prompt `[i]` (completions) or the text
    `"i"` (chat); `bodies` keeps every request body it was sent (as JSON goes on the wire)."""

    script: list[ScriptedRequest]
    clock: FakeClock
    bodies: list[dict] = field(default_factory=list)

    @asynccontextmanager
    async def stream(self, url: str, body: dict) -> AsyncIterator[ScriptedResponse]:
        body = json.loads(json.dumps(body))
        self.bodies.append(body)
        chat = "messages" in body
        index = int(body["messages"][0]["content"]) if chat else body["prompt"][0]
        entry = self.script[index]
        if entry.status != 200:
            yield ScriptedResponse(entry.status, _once(json.dumps({"error": {"message": "scripted failure"}}).encode()))
        else:
            yield ScriptedResponse(200, self.answer(entry, chat))

    async def get_json(self, url: str) -> dict:
        return {"error": "HTTP 404"}

    async def post_json(self, url: str) -> dict:
        return {"error": "HTTP 404"}

    async def answer(self, entry: ScriptedRequest, chat: bool) -> AsyncIterator[bytes]:
        if chat:  # a chat stream opens with the role, no text: no token
            yield event({"choices": [{"index": 0, "delta": {"role": "assistant", "content": ""}}]})
        for number, wait in enumerate((entry.ttft, *entry.gaps)):
            self.clock.now += wait
            text = f"w{number} "
            choice = {"index": 0, "delta": {"content": text}} if chat else {"index": 0, "text": text}
            yield event({"choices": [choice]})
        if entry.usage_completion_tokens is not None:
            usage = {"prompt_tokens": entry.usage_prompt_tokens, "completion_tokens": entry.usage_completion_tokens}
            yield event({"choices": [], "usage": usage})
        yield b"data: [DONE]\n\n"


def event(payload: dict) -> bytes:
    """One server-sent event."""
    return f"data: {json.dumps(payload)}\n\n".encode()
