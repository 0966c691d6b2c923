"""The prefix-cache state `accord bench serve --reset-prefix-cache` records, from what
`POST /reset_prefix_cache` answers on the wire (an aiohttp server on loopback): vLLM's
`{"success": true}` and an empty 200 are a reset; `{"success": false}` (blocks still
held) and an absent route are not, and say why."""

from __future__ import annotations

import asyncio

import pytest
from aiohttp import web
from aiohttp.test_utils import TestServer

from accord.bench.serve.http_session import AiohttpSession
from accord.bench.serve.server_info import reset_prefix_cache

ANSWERS = {
    "success": (lambda: web.json_response({"success": True}), "reset"),
    "empty-200": (lambda: web.Response(status=200), "reset"),
    "blocks-held": (lambda: web.json_response({"success": False}), "not reset: POST /reset_prefix_cache answered success=false"),
    "absent": (lambda: web.Response(status=404, text="Not Found"), "not reset: POST /reset_prefix_cache answered HTTP 404"),
}


@pytest.mark.parametrize("answer", list(ANSWERS))
def test_the_recorded_state_follows_the_servers_answer(answer: str) -> None:
    respond, expected = ANSWERS[answer]

    async def handler(request: web.Request) -> web.Response:
        assert request.method == "POST"
        return respond()

    async def scenario() -> str:
        app = web.Application()
        app.router.add_post("/reset_prefix_cache", handler)
        async with TestServer(app, host="127.0.0.1") as server:
            async with AiohttpSession(None, {}) as http:
                return await reset_prefix_cache(http, str(server.make_url("")).rstrip("/"))

    state = asyncio.run(scenario())
    assert state.startswith(expected), state
