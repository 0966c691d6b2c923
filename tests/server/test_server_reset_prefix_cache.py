"""`POST /reset_prefix_cache` (vLLM's admin route, as `accord bench serve
--reset-prefix-cache` calls it), on the app over the demo model's engine: a repeated
prompt's usage reports cached prompt tokens until the reset and none after it, and
the route needs the API key like the rest of the API. The app runs over the session's
offline engine (same model and settings as the server), so no engine is built here."""

from __future__ import annotations

import asyncio
import httpx
from server_harness import API_KEY

from accord.core.engine.async_llm import AsyncLLM
from accord.server.app import create_app
from accord.server.options import ServerOptions
from accord.server.serving import ServedModel

#: 40 prompt ids: two full blocks of 16 the cache can hold.
PROMPT = list(range(5, 45))


def test_after_a_reset_a_repeated_prompt_reports_no_cached_tokens(offline_llm) -> None:
    engine = AsyncLLM(offline_llm.llm_engine)
    served = ServedModel("demo", "demo", engine.max_model_len, engine.model_config.vocab_size)
    options = ServerOptions(api_keys=(API_KEY,), enable_prompt_tokens_details=True)
    app = create_app(engine, served, options)
    body = {"model": "demo", "prompt": PROMPT, "max_tokens": 2, "temperature": 0}

    async def scenario() -> tuple[list[int], httpx.Response, httpx.Response]:
        auth = {"Authorization": f"Bearer {API_KEY}"}
        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(transport=transport, base_url="http://test", headers=auth, timeout=60) as client:

            async def cached_tokens() -> int:
                answer = await client.post("/v1/completions", json=body)
                assert answer.status_code == 200, answer.text
                return answer.json()["usage"]["prompt_tokens_details"]["cached_tokens"]

            cached = [await cached_tokens(), await cached_tokens()]
            without_key = await client.post("/reset_prefix_cache", headers={"Authorization": ""})
            reset = await client.post("/reset_prefix_cache")
            cached.append(await cached_tokens())
            return cached, without_key, reset

    try:
        cached, without_key, reset = asyncio.run(scenario())
    finally:
        asyncio.run(engine.shutdown())  # its loop only: the session's engine serves on
    assert without_key.status_code == 401
    assert reset.status_code == 200 and reset.json() == {"success": True}
    assert cached[1:] == [32, 0], "the repeat hits two blocks; after the reset it hits none"
