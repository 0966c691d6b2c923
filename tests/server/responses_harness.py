"""The app in process over one engine, in its own event loop, with the official openai
client on it: what the Responses API tests drive (several apps may share the engine,
each with its own server options)."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import httpx
import openai

from accord import AsyncLLM
from accord.server.app import create_app
from accord.server.options import ServerOptions
from accord.server.serving import ServedModel

MODEL = "tiny"
ENGINE_ARGS = {"max_model_len": 256, "kv_cache_memory": 16 << 20, "max_num_seqs": 8}


class InProcessEngine:
    """One engine over `model_dir`, and the event loop every app on it runs in."""

    def __init__(self, model_dir: Path) -> None:
        self.model_dir = model_dir
        self.runner = asyncio.Runner()
        self.engine = self.runner.run(self._start(model_dir))
        self.apps: list[InProcessApp] = []

    @staticmethod
    async def _start(model_dir: Path) -> AsyncLLM:
        return AsyncLLM.from_engine_args(str(model_dir), **ENGINE_ARGS)

    def app(self, **options: Any) -> InProcessApp:
        """An app with these ServerOptions over the engine."""
        served = InProcessApp(self, ServerOptions(**options))
        self.apps.append(served)
        return served

    def run(self, awaitable: Any) -> Any:
        """Run a coroutine in the engine's loop."""
        return self.runner.run(awaitable)

    def close(self) -> None:
        for served in self.apps:
            self.run(served.http.aclose())
        self.run(self.engine.shutdown())
        self.runner.close()


class InProcessApp:
    """The app over an InProcessEngine, its raw HTTP client and an openai AsyncOpenAI."""

    def __init__(self, engine: InProcessEngine, options: ServerOptions) -> None:
        self.engine = engine
        llm = engine.engine
        model = ServedModel(MODEL, str(engine.model_dir), llm.max_model_len, llm.model_config.vocab_size)
        self.http = httpx.AsyncClient(transport=httpx.ASGITransport(app=create_app(llm, model, options)),
                                      base_url="http://test", timeout=120)
        self.client = openai.AsyncOpenAI(base_url="http://test/v1", api_key="none", http_client=self.http,
                                         max_retries=0)

    def run(self, awaitable: Any) -> Any:
        """Run a coroutine in the engine's loop."""
        return self.engine.run(awaitable)

    def post(self, path: str, body: dict[str, Any]) -> httpx.Response:
        """A raw POST (for bodies the client would not send, and raw events)."""
        return self.run(self.http.post(path, json=body))
