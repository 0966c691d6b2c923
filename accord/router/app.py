"""The router's HTTP front: every path an `accord serve` answers is forwarded (the
generation endpoints through PD mode when configured), plus its own /health (200
while every role has an instance in rotation) and /metrics (per instance)."""

from __future__ import annotations

import asyncio
import contextlib
import json
from collections.abc import AsyncIterator

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, Response
from prometheus_client import CONTENT_TYPE_LATEST

from ..client_disconnect import cancel_on_disconnect
from .config import RouterConfig
from .metrics import render
from .proxy import Router, error_body, logger


def build_app(config: RouterConfig) -> FastAPI:
    """The router's FastAPI app; its health checks run while it serves."""
    router = Router(config)

    async def check_forever() -> None:
        while True:
            await router.check_health()
            await asyncio.sleep(config.health_interval_s)

    @contextlib.asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        checker = asyncio.create_task(check_forever())
        try:
            yield
        finally:
            checker.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await checker
            await router.close()

    app = FastAPI(title="accord router", lifespan=lifespan)
    app.state.router = router

    @app.get("/health")
    async def health() -> Response:
        down = [pool.instances[0].role for pool in router.pools if not pool.healthy]
        if down:
            return JSONResponse(error_body(f"no healthy {' or '.join(down)} instance", 503), status_code=503)
        return Response(status_code=200)

    @app.get("/metrics")
    async def metrics() -> Response:
        return Response(render(router.pools), media_type=CONTENT_TYPE_LATEST)

    @app.api_route("/{path:path}", methods=["GET", "POST"])
    async def forward(path: str, request: Request) -> Response:
        body = None
        if request.method == "POST":
            try:
                body = json.loads(await request.body())
            except json.JSONDecodeError as error:
                return JSONResponse({"error": {"message": f"the body is not JSON: {error}", "type":
                                     "invalid_request_error", "param": None, "code": 400}}, status_code=400)
            if not isinstance(body, dict):
                return JSONResponse({"error": {"message": "the body must be a JSON object", "type":
                                     "invalid_request_error", "param": None, "code": 400}}, status_code=400)
        return await cancel_on_disconnect(router.handle(request.method, "/" + path, body, request.headers), request, logger)

    return app
