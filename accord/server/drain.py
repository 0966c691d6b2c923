"""The end of a graceful shutdown's drain window, shared by the server (which starts
the clock) and the requests still running (which end cleanly when it runs out: a
stream with an error event and `[DONE]`, a whole response with a JSON 503), before
uvicorn would cancel them mid-response."""

from __future__ import annotations

import asyncio

from .errors import OpenAIError


class DrainDeadline:
    """Set when in-flight requests must stop."""

    def __init__(self) -> None:
        self._expired: asyncio.Event | None = None

    @property
    def event(self) -> asyncio.Event:
        """The event requests wait on (made on first use, inside the server's loop)."""
        if self._expired is None:
            self._expired = asyncio.Event()
        return self._expired

    def expire(self) -> None:
        """Stop the requests in flight."""
        self.event.set()

    @staticmethod
    def error() -> OpenAIError:
        """What a request cut by the deadline reports."""
        return OpenAIError(
            "the server is shutting down and could not finish this request in time; retry",
            status_code=503, code="server_shutting_down",
        )
