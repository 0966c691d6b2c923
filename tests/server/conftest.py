"""Fixtures for the server tests: the demo model in a private cache, and `accord serve`
started as a real subprocess on a free loopback port (one per test session)."""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import httpx
import openai
import pytest
from server_harness import API_KEY, ENGINE_ARGS, ENGINE_FLAGS, ServerProcess

@pytest.fixture(scope="session")
def cache_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A private accord cache (the demo model is generated there once per session)."""
    return tmp_path_factory.mktemp("accord-cache")


@pytest.fixture(scope="session")
def demo_model(cache_dir: Path) -> Path:
    """The demo model directory, generated in the private cache."""
    from accord.demo.model import demo_model_dir

    previous = os.environ.get("ACCORD_CACHE_DIR")
    os.environ["ACCORD_CACHE_DIR"] = str(cache_dir)
    try:
        return demo_model_dir()
    finally:
        if previous is None:
            del os.environ["ACCORD_CACHE_DIR"]
        else:
            os.environ["ACCORD_CACHE_DIR"] = previous


@pytest.fixture(scope="session")
def server(demo_model: Path, cache_dir: Path) -> Iterator[ServerProcess]:
    """The shared server: the random demo model (the harness passes --model accord-demo-random), API key required."""
    process = ServerProcess("--api-key", API_KEY, *ENGINE_FLAGS, cache_dir=cache_dir)
    yield process
    process.stop()


@pytest.fixture(scope="session")
def client(server: ServerProcess) -> openai.OpenAI:
    """The official OpenAI client, pointed at the shared server."""
    return openai.OpenAI(base_url=f"{server.url}/v1", api_key=API_KEY, max_retries=0, timeout=60)


@pytest.fixture(scope="session")
def http(server: ServerProcess) -> Iterator[httpx.Client]:
    """A plain HTTP client with the API key, for raw bodies and non-OpenAI routes."""
    with httpx.Client(base_url=server.url, headers={"Authorization": f"Bearer {API_KEY}"}, timeout=60) as client:
        yield client


@pytest.fixture(scope="session")
def offline_llm(demo_model: Path):
    """The offline `LLM` API over the same model and engine settings as the server."""
    from accord import LLM

    return LLM(str(demo_model), **ENGINE_ARGS)
