"""Cancels a request handler whose client has gone away, so a non-streamed request that
is still generating is aborted (and its KV blocks freed) instead of running on for
nobody. Streamed responses watch for this themselves once they start."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable
from typing import TypeVar

from fastapi import Request, Response

from .errors import logger

T = TypeVar("T")

#: nginx's code for "client closed request"; nobody receives it, but logs show it.
CLIENT_CLOSED_REQUEST = 499


async def cancel_on_disconnect(handler: Awaitable[T], request: Request) -> T | Response:
    """Run `handler`; if the client disconnects first, cancel it (its cleanup aborts
    the engine requests) and answer 499 (to nobody: a disconnect is normal, so it is
    logged quietly, never as an error)."""
    work = asyncio.ensure_future(handler)
    disconnect = asyncio.ensure_future(_disconnected(request))
    try:
        await asyncio.wait((work, disconnect), return_when=asyncio.FIRST_COMPLETED)
    finally:
        disconnect.cancel()
    if not work.done():
        work.cancel()
        logger.info("client disconnected from %s; its request was aborted", request.url.path)
        return Response(status_code=CLIENT_CLOSED_REQUEST)
    return work.result()


async def _disconnected(request: Request) -> None:
    # The body has been read by now, so the next ASGI message is the disconnect.
    while (await request.receive())["type"] != "http.disconnect":
        pass
