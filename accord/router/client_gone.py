"""A routed request whose client leaves before its answer is ready is cancelled: its
upstream connections close, so the prefill or decode instance aborts its engine
request and frees its KV blocks (a decode instance that had not read the prefill
instance's blocks yet tells it to free them), instead of generating for nobody. A
stream already relayed notices the client leaving itself."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Coroutine
from typing import Any

from fastapi import Request, Response

#: nginx's "client closed request": the status of an answer nobody is left to read.
CLIENT_CLOSED_REQUEST = 499


async def unless_client_leaves(answer: Coroutine[Any, Any, Response], request: Request) -> Response:
    """`answer`'s response, or, once `request`'s client has disconnected, `answer`
    cancelled (its cleanup closes the upstreams) and a 499 for nobody."""
    answering = asyncio.ensure_future(answer)
    leaving = asyncio.ensure_future(_client_left(request))
    await asyncio.wait((answering, leaving), return_when=asyncio.FIRST_COMPLETED)
    leaving.cancel()
    if answering.done():
        return answering.result()
    answering.cancel()
    with contextlib.suppress(asyncio.CancelledError):
        await answering
    return Response(status_code=CLIENT_CLOSED_REQUEST)


async def _client_left(request: Request) -> None:
    # The body was read before routing, so what the client sends next is its disconnect.
    while (await request.receive())["type"] != "http.disconnect":
        continue
