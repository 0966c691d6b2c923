"""Bearer-token authentication, checked before anything else reads the request (so a
bad body without a key gets 401, not 400) on every route that touches the model."""

from __future__ import annotations

import secrets
from collections.abc import Sequence

from starlette.types import ASGIApp, Receive, Scope, Send

from .errors import OpenAIError

#: Routes that need the key: the API, the tokenizer endpoints and the prefix-cache
#: reset (anyone could otherwise empty the cache). /health and /metrics stay open for
#: probes and scrapers, as in vLLM.
PROTECTED_PREFIXES = ("/v1/", "/tokenize", "/detokenize", "/reset_prefix_cache")


def key_index(authorization: str, api_keys: Sequence[str]) -> int | None:
    """The place in `api_keys` of the key an `Authorization` header value carries as
    `Bearer <key>` (None: no such key)."""
    scheme, _, token = authorization.partition(" ")
    # compare_digest, against every key: a plain == would leak the key's prefix through timing.
    matches = [secrets.compare_digest(token.strip().encode(), key.encode()) for key in api_keys]
    return matches.index(True) if scheme.lower() == "bearer" and any(matches) else None


def is_authorized(authorization: str, api_keys: Sequence[str]) -> bool:
    """Whether an `Authorization` header value carries `Bearer <key>` for one of `api_keys`."""
    return key_index(authorization, api_keys) is not None


class ApiKeyMiddleware:
    """ASGI middleware answering 401 to protected requests without the key."""

    def __init__(self, app: ASGIApp, api_keys: Sequence[str]) -> None:
        self.app = app
        self.api_keys = api_keys

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        # Behind --root-path a route is reached with the prefix too: protected all the same.
        path = scope["path"].removeprefix(scope.get("root_path", "")) if scope["type"] == "http" else ""
        if path.startswith(PROTECTED_PREFIXES):
            headers = {name.lower(): value for name, value in scope["headers"]}
            if not is_authorized(headers.get(b"authorization", b"").decode("latin-1"), self.api_keys):
                error = OpenAIError(
                    "missing or incorrect API key: send 'Authorization: Bearer <key>'", status_code=401,
                    code="invalid_api_key", headers={"WWW-Authenticate": "Bearer"},
                )
                await error.response()(scope, receive, send)
                return
        await self.app(scope, receive, send)
