"""Bearer-token authentication for the `/v1` API when the server has an API key."""

from __future__ import annotations

import secrets
from collections.abc import Awaitable, Callable

from fastapi import Request

from .errors import OpenAIError


def api_key_checker(api_key: str | None) -> Callable[[Request], Awaitable[None]]:
    """A FastAPI dependency that refuses, with 401, any request whose
    `Authorization: Bearer <key>` header does not carry `api_key`; with no key it
    lets everything through."""

    async def check(request: Request) -> None:
        if api_key is None:
            return
        scheme, _, token = request.headers.get("authorization", "").partition(" ")
        # compare_digest: a plain == would leak the key's prefix through timing.
        if scheme.lower() != "bearer" or not secrets.compare_digest(token.strip().encode(), api_key.encode()):
            raise OpenAIError(
                "missing or incorrect API key: send 'Authorization: Bearer <key>'", status_code=401, code="invalid_api_key"
            )

    return check
