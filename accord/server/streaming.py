"""Streaming helpers: server-sent events as OpenAI sends them, the part of each choice a
client has not seen yet, and merging several engine requests' outputs."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Sequence
from contextlib import aclosing
from dataclasses import dataclass
from typing import TypeVar

from pydantic import BaseModel

from ..core.outputs import CompletionOutput, SampleLogprobs
from .errors import OpenAIError
from .request_stream import engine_failure

T = TypeVar("T")

DONE_EVENT = "data: [DONE]\n\n"


def sse_event(chunk: BaseModel) -> str:
    """One `data: <json>` event carrying `chunk`."""
    return f"data: {chunk.model_dump_json()}\n\n"


def error_event(error: Exception) -> str:
    """An event reporting a failure after the stream began (its status line is sent)."""
    reported = error if isinstance(error, OpenAIError) else engine_failure(error)
    return sse_event(reported.body())


async def sse_stream(chunks: AsyncIterator[BaseModel]) -> AsyncIterator[str]:
    """`chunks` as OpenAI streams them: one event each, a failure after the first
    reported in-band, then `[DONE]`. Closing this closes `chunks` at once (a client gone
    away: their cleanup aborts the engine request)."""
    async with aclosing(chunks):  # type: ignore[type-var]
        try:
            async for chunk in chunks:
                yield sse_event(chunk)
        except Exception as error:  # the response has begun: report the failure in-band
            yield error_event(error)
    yield DONE_EVENT


def partial_marker_length(text: str, markers: Sequence[str]) -> int:
    """How many trailing characters of `text` could begin one of `markers`: what a
    streaming parser holds back until the next piece tells whether a marker follows."""
    markers = [marker for marker in markers if marker]
    if not markers:
        return 0
    for size in range(min(max(map(len, markers)) - 1, len(text)), 0, -1):
        if any(marker.startswith(text[-size:]) for marker in markers):
            return size
    return 0


@dataclass(frozen=True)
class SampleDelta:
    """What one choice gained since the client last heard of it."""

    index: int
    text: str
    token_ids: list[int]
    logprobs: SampleLogprobs | None
    #: The choice's tokens sent before this delta.
    previous_token_ids: list[int]
    finish_reason: str | None


@dataclass
class _Sent:
    text: int = 0
    tokens: int = 0
    finished: bool = False


class DeltaTracker:
    """Turns cumulative engine outputs into per-choice deltas, each token sent once."""

    def __init__(self) -> None:
        self._sent: dict[int, _Sent] = {}

    def delta(self, index: int, sample: CompletionOutput) -> SampleDelta | None:
        """The news in `sample` (choice `index`), or None when there is none."""
        sent = self._sent.setdefault(index, _Sent())
        new_tokens = sample.token_ids[sent.tokens :]
        if sent.finished or (not new_tokens and not sample.finished()):
            return None
        delta = SampleDelta(
            index=index,
            text=sample.text[sent.text :],
            token_ids=new_tokens,
            logprobs=None if sample.logprobs is None else sample.logprobs[sent.tokens :],
            previous_token_ids=sample.token_ids[: sent.tokens],
            finish_reason=sample.finish_reason,
        )
        sent.text, sent.tokens, sent.finished = len(sample.text), len(sample.token_ids), sample.finished()
        return delta


def whole(index: int, sample: CompletionOutput) -> SampleDelta:
    """A finished sample as one delta (the non-streamed response)."""
    delta = DeltaTracker().delta(index, sample)
    assert delta is not None, "a finished sample always has a delta"
    return delta


async def merge_streams(streams: Sequence[AsyncIterator[T]]) -> AsyncIterator[tuple[int, T]]:
    """Items of several async iterators as they come, tagged with the iterator's index."""
    if len(streams) == 1:
        async for item in streams[0]:
            yield 0, item
        return
    queue: asyncio.Queue[tuple[int, object]] = asyncio.Queue()
    end = object()

    async def pump(index: int, stream: AsyncIterator[T]) -> None:
        try:
            async for item in stream:
                await queue.put((index, item))
            await queue.put((index, end))
        except Exception as error:  # handed to the consumer, which re-raises it
            await queue.put((index, error))

    tasks = [asyncio.create_task(pump(index, stream)) for index, stream in enumerate(streams)]
    try:
        remaining = len(tasks)
        while remaining:
            index, item = await queue.get()
            if item is end:
                remaining -= 1
            elif isinstance(item, Exception):
                raise item
            else:
                yield index, item  # type: ignore[misc]
    finally:
        for task in tasks:
            task.cancel()
