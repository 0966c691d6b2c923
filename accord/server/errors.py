"""OpenAI-style errors: one exception type the serving code raises, and the FastAPI
handlers that turn it, request-validation failures, HTTP errors and unexpected crashes
into `{"error": {"message", "type", "param", "code"}}` bodies."""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence
from http import HTTPStatus
from typing import Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from starlette.exceptions import HTTPException

from .protocol import ErrorInfo, ErrorResponse

logger = logging.getLogger("accord.server")

#: OpenAI's error `type` for each status the server answers with.
_ERROR_TYPES = {
    400: "invalid_request_error",
    401: "authentication_error",
    404: "not_found_error",
    405: "invalid_request_error",
    413: "invalid_request_error",
    429: "rate_limit_error",
    500: "internal_server_error",
    503: "service_unavailable_error",
}


class OpenAIError(Exception):
    """A request failure the client is told about: an HTTP status and an OpenAI body."""

    def __init__(
        self,
        message: str,
        *,
        status_code: int = 400,
        param: str | None = None,
        code: str | None = None,
        headers: Mapping[str, str] | None = None,
    ):
        super().__init__(message)
        self.message = message
        self.status_code = status_code
        self.param = param
        self.code = code
        self.headers = dict(headers or {})

    def body(self) -> ErrorResponse:
        """The OpenAI error body that reports this error."""
        error_type = _ERROR_TYPES.get(self.status_code) or _phrase(self.status_code)
        return ErrorResponse(error=ErrorInfo(message=self.message, type=error_type, param=self.param, code=self.code))

    def response(self) -> JSONResponse:
        """The JSON response that reports this error."""
        return JSONResponse(self.body().model_dump(), status_code=self.status_code, headers=self.headers)


def _phrase(status_code: int) -> str:
    # Not every status is an HTTPStatus member (nginx's 499 is not).
    try:
        return HTTPStatus(status_code).phrase.lower().replace(" ", "_")
    except ValueError:
        return "error"


def internal_error() -> OpenAIError:
    """The 500 a client gets for a failure inside the server; the cause is logged,
    never sent (exception text can carry paths and internals)."""
    return OpenAIError("internal server error; the server log has the details", status_code=500, code="internal_error")


def install_error_handlers(app: FastAPI) -> None:
    """Route every error an app can raise through the OpenAI error body."""

    @app.exception_handler(OpenAIError)
    async def _openai_error(request: Request, error: OpenAIError) -> JSONResponse:
        return error.response()

    @app.exception_handler(RequestValidationError)
    async def _validation_error(request: Request, error: RequestValidationError) -> JSONResponse:
        message, param = describe_validation_errors(error.errors())
        return OpenAIError(message, param=param).response()

    @app.exception_handler(HTTPException)
    async def _http_error(request: Request, error: HTTPException) -> JSONResponse:
        # Keeps the exception's headers: a 405 must say which methods are allowed.
        return OpenAIError(str(error.detail), status_code=error.status_code, headers=error.headers).response()

    @app.exception_handler(Exception)
    async def _unexpected_error(request: Request, error: Exception) -> JSONResponse:
        logger.exception("unexpected error serving %s", request.url.path)
        return internal_error().response()


def describe_validation_errors(errors: Sequence[Any]) -> tuple[str, str | None]:
    """A readable message for pydantic's validation errors, and the first bad
    top-level field as the `param` (the message carries the full location). When a
    field's union has a check that says why (a ValueError), that reason alone is kept
    rather than one complaint per union member."""
    reasons = [e for e in errors if e.get("type") == "value_error"]
    parts, params = [], []
    for error in reasons or errors:
        # Keep field names and indices; drop pydantic's union-member labels.
        location = [str(item) for item in error.get("loc", ()) if item != "body" and _is_location_part(item)]
        if error.get("type") == "json_invalid":
            parts.append(f"the request body is not valid JSON: {error.get('ctx', {}).get('error', error['msg'])}")
            continue
        params.append(location[0] if location else None)
        parts.append(f"{'.'.join(location)}: {error['msg']}" if location else error["msg"])
    return "; ".join(dict.fromkeys(parts)) or "invalid request", next(iter(params), None)


def _is_location_part(item: Any) -> bool:
    return isinstance(item, int) or str(item).isidentifier()
