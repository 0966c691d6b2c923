"""Cancels a request handler whose HTTP client has gone away, so that a request still
being answered is aborted (its KV blocks freed, on this instance or, through the router,
on the instances behind it) instead of running on for nobody. Streamed responses watch
for this themselves once they start.

Shared by the server and the router, which imports nothing of the engine: only asyncio
and the ASGI request."""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Awaitable
from typing import TypeVar

from fastapi import Request, Response

T = TypeVar("T")

#: nginx's code for "client closed request"; nobody receives it, but logs show it.
CLIENT_CLOSED_REQUEST = 499


async def cancel_on_disconnect(handler: Awaitable[T], request: Request, logger: logging.Logger) -> T | Response:
    """Run `handler`; if the client disconnects first, cancel it, wait for its cleanup
    (which aborts the engine requests or closes the upstream connections) and answer 499
    (to nobody: a disconnect is normal, so `logger` notes it quietly, never as an error)."""
    work = asyncio.ensure_future(handler)
    disconnect = asyncio.ensure_future(_disconnected(request))
    try:
        await asyncio.wait((work, disconnect), return_when=asyncio.FIRST_COMPLETED)
    finally:
        disconnect.cancel()
    if work.done():
        return work.result()
    work.cancel()
    with contextlib.suppress(asyncio.CancelledError):
        await work
    logger.info("client disconnected from %s; its request was aborted", request.url.path)
    return Response(status_code=CLIENT_CLOSED_REQUEST)


async def _disconnected(request: Request) -> None:
    # The body has been read by now, so the next ASGI message is the disconnect.
    while (await request.receive())["type"] != "http.disconnect":
        pass
