"""The HTTP side of `accord bench serve`, on aiohttp: its C parser reads a streamed
chunk for a quarter of the CPU httpx's pure-Python h11 takes (19 vs 81 us a chunk
against a stub, benchmarks/bench_client_overhead.py; vLLM's client, aiohttp too: 20 us),
and on a 2-core host every microsecond the client spends is taken from the server it
measures. The rest of the package sees only `HttpSession`, so the tests
feed a scripted stream through the same parsing and timing code."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass
from typing import Any, Protocol

import aiohttp


class StreamedResponse(Protocol):
    """A response being read: its status, and its body as it arrives."""

    status: int

    def chunks(self) -> AsyncIterator[bytes]:
        """The body's bytes, in pieces as they come off the connection."""
        ...


class HttpSession(Protocol):
    """What the client needs of HTTP: a streamed POST, a GET of JSON, a bodiless POST."""

    def stream(self, url: str, body: dict[str, Any]) -> Any:
        """An async context manager for a streamed POST of `body`: a StreamedResponse."""
        ...

    async def get_json(self, url: str) -> Any:
        """The JSON `url` answers, or {"error": why}."""
        ...

    async def post_json(self, url: str) -> Any:
        """The JSON a bodiless POST to `url` answers ({} for an empty body), or {"error": why}."""
        ...


#: The errors a request can meet on the wire, reported as its outcome.
TRANSPORT_ERRORS = (aiohttp.ClientError, TimeoutError, ConnectionError)


@dataclass
class _AiohttpResponse:
    response: aiohttp.ClientResponse

    @property
    def status(self) -> int:
        return self.response.status

    def chunks(self) -> AsyncIterator[bytes]:
        return self.response.content.iter_any()


class AiohttpSession:
    """`HttpSession` over one aiohttp connection pool: at most `max_connections` open
    (None: no cap, so the pool never limits concurrency behind the flags' back), a
    connection opened within a minute, a response as slow as it is; no proxy from the
    environment (the server is measured, not a proxy)."""

    def __init__(self, max_connections: int | None, headers: dict[str, str]) -> None:
        connector = aiohttp.TCPConnector(limit=max_connections or 0, keepalive_timeout=60)
        timeout = aiohttp.ClientTimeout(total=None, sock_connect=60)
        self.session = aiohttp.ClientSession(connector=connector, timeout=timeout, headers=headers, trust_env=False)

    async def __aenter__(self) -> AiohttpSession:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.session.close()

    @asynccontextmanager
    async def stream(self, url: str, body: dict[str, Any]) -> AsyncIterator[_AiohttpResponse]:
        """A streamed POST of `body` as JSON."""
        async with self.session.post(url, json=body) as response:
            yield _AiohttpResponse(response)

    async def get_json(self, url: str) -> Any:
        """The JSON `url` answers, or {"error": why}."""
        return await self._json("GET", url)

    async def post_json(self, url: str) -> Any:
        """The JSON a bodiless POST to `url` answers ({} for an empty body), or {"error": why}."""
        return await self._json("POST", url)

    async def _json(self, method: str, url: str) -> Any:
        try:
            async with self.session.request(method, url) as response:
                if response.status != 200:
                    return {"error": f"HTTP {response.status}"}
                text = await response.text()
        except TRANSPORT_ERRORS as error:
            return {"error": f"{type(error).__name__}: {error}"}
        if not text.strip():
            return {}  # an empty 200: how older vLLM answered /reset_prefix_cache
        try:
            return json.loads(text)
        except ValueError:
            return {"error": "not JSON", "text": text[:200]}
