"""A cap on request body size: 413 with an OpenAI error body past it, whether the
client declares the length or streams the body in chunks."""

from __future__ import annotations

from typing import TYPE_CHECKING

from starlette.types import ASGIApp, Message, Receive, Scope, Send

if TYPE_CHECKING:
    from .errors import OpenAIError

#: The default cap: far more than any prompt max-model-len allows, small enough that
#: a hostile body cannot take the server's memory.
DEFAULT_MAX_REQUEST_BODY_BYTES = 16 << 20


def body_too_large(limit: int) -> OpenAIError:
    """The 413 for a body past `limit` bytes."""
    from .errors import OpenAIError  # the CLI reads this module's default without the web stack

    return OpenAIError(
        f"the request body is larger than this server accepts ({limit} bytes; see --max-request-body-bytes)",
        status_code=413, code="request_too_large",
    )


class BodyLimitMiddleware:
    """ASGI middleware refusing bodies over `limit` bytes."""

    def __init__(self, app: ASGIApp, limit: int) -> None:
        self.app = app
        self.limit = limit

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        headers = {name.lower(): value for name, value in scope["headers"]}
        declared = headers.get(b"content-length")
        if declared is not None and declared.isdigit() and int(declared) > self.limit:
            await body_too_large(self.limit).response()(scope, receive, send)
            return
        received, refused = 0, False

        async def counting_receive() -> Message:
            # Past the cap the 413 goes out at once and the app is told the client
            # left, so it stops reading; whatever it answers then is dropped.
            nonlocal received, refused
            if refused:
                return {"type": "http.disconnect"}
            message = await receive()
            if message["type"] == "http.request":
                received += len(message.get("body", b""))
                if received > self.limit:
                    refused = True
                    await body_too_large(self.limit).response()(scope, receive, send)
                    return {"type": "http.disconnect"}
            return message

        async def guarded_send(message: Message) -> None:
            if not refused:
                await send(message)

        await self.app(scope, counting_receive, guarded_send)
