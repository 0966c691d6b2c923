"""Bearer-token authentication, checked before anything else reads the request (so a
bad body without a key gets 401, not 400) on every route that touches the model."""

from __future__ import annotations

import secrets

from starlette.types import ASGIApp, Receive, Scope, Send

from .errors import OpenAIError

#: Routes that need the key: the API and the tokenizer endpoints. /health and
#: /metrics stay open for probes and scrapers, as in vLLM.
PROTECTED_PREFIXES = ("/v1/", "/tokenize", "/detokenize")


def is_authorized(authorization: str, api_key: str) -> bool:
    """Whether an `Authorization` header value carries `Bearer <api_key>`."""
    scheme, _, token = authorization.partition(" ")
    # compare_digest: a plain == would leak the key's prefix through timing.
    return scheme.lower() == "bearer" and secrets.compare_digest(token.strip().encode(), api_key.encode())


class ApiKeyMiddleware:
    """ASGI middleware answering 401 to protected requests without the key."""

    def __init__(self, app: ASGIApp, api_key: str) -> None:
        self.app = app
        self.api_key = api_key

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http" and scope["path"].startswith(PROTECTED_PREFIXES):
            headers = {name.lower(): value for name, value in scope["headers"]}
            if not is_authorized(headers.get(b"authorization", b"").decode("latin-1"), self.api_key):
                error = OpenAIError(
                    "missing or incorrect API key: send 'Authorization: Bearer <key>'", status_code=401,
                    code="invalid_api_key", headers={"WWW-Authenticate": "Bearer"},
                )
                await error.response()(scope, receive, send)
                return
        await self.app(scope, receive, send)
