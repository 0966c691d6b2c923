"""Stored responses (`store: true`), for `GET /v1/responses/{id}`, cancel and
`previous_response_id`: held in memory, at most --responses-store-size of them, the
least recently used evicted first. An evicted id is unknown from then on (404)."""

from __future__ import annotations

import asyncio
from collections import OrderedDict
from dataclasses import dataclass

from ..errors import OpenAIError
from ..options import DEFAULT_RESPONSES_STORE_SIZE
from ..protocol import ChatMessage
from .protocol import ResponseObject


@dataclass
class StoredResponse:
    """A response, the conversation a later turn continues (its input, without the
    instructions, then its output), and its work while it runs in the background."""

    response: ResponseObject
    conversation: list[ChatMessage]
    task: asyncio.Task[None] | None = None

    def running(self) -> bool:
        """Whether its background work is still going."""
        return self.task is not None and not self.task.done()


class ResponseStore:
    """The stored responses by id, least recently used first out."""

    def __init__(self, capacity: int = DEFAULT_RESPONSES_STORE_SIZE) -> None:
        if capacity < 0:
            raise ValueError(f"the responses store size must be at least 0, got {capacity}")
        self.capacity = capacity
        self._entries: OrderedDict[str, StoredResponse] = OrderedDict()

    def __len__(self) -> int:
        return len(self._entries)

    def put(self, entry: StoredResponse) -> None:
        """Keep `entry` (replacing an earlier one of its id), evicting the least
        recently used past the capacity; an evicted background response is cancelled,
        as nobody could fetch its result."""
        self._entries[entry.response.id] = entry
        self._entries.move_to_end(entry.response.id)
        while len(self._entries) > self.capacity:
            _, evicted = self._entries.popitem(last=False)
            if evicted.running():
                evicted.task.cancel()  # type: ignore[union-attr]

    def get(self, response_id: str, param: str | None = None) -> StoredResponse:
        """The stored response `response_id` (now the most recently used); 404 when
        it was never stored or has been evicted or deleted."""
        entry = self._entries.get(response_id)
        if entry is None:
            raise OpenAIError(
                f"Response with id '{response_id}' not found (never stored, deleted, or evicted: this server keeps the "
                f"{self.capacity} most recently used, --responses-store-size)",
                status_code=404, param=param, code="response_not_found",
            )
        self._entries.move_to_end(response_id)
        return entry

    def pop(self, response_id: str) -> StoredResponse:
        """Remove and return the stored response `response_id` (404 as `get`)."""
        entry = self.get(response_id)
        del self._entries[response_id]
        return entry

    def running(self) -> list[StoredResponse]:
        """The background responses still running."""
        return [entry for entry in self._entries.values() if entry.running()]
