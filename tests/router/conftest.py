"""Fixtures for the router tests: `accord serve` instances (the demo model, through the
server tests' harness), `accord router` itself (on a thread), and an upstream that
dies at a chosen point of its answer, so failures are tested without timing."""

from __future__ import annotations

import json
import socket
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import uvicorn

from accord.cli.main import build_parser
from accord.router.app import build_app
from accord.router.cli import router_config

_SERVER_HELPERS = str(Path(__file__).resolve().parent.parent / "server")
if _SERVER_HELPERS not in sys.path:
    sys.path.insert(0, _SERVER_HELPERS)

from server_harness import ENGINE_FLAGS, ServerProcess, free_port  # noqa: E402

STARTUP_TIMEOUT_S = 60.0


def shared_storage(role: str, path: Path) -> str:
    """A --kv-transfer-config for SharedStorageConnector in `role` over `path`."""
    return json.dumps({"kv_connector": "SharedStorageConnector", "kv_role": role,
                       "kv_connector_extra_config": {"shared_storage_path": str(path)}})


@pytest.fixture(scope="session")
def cache_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A private accord cache: the demo model is generated there once, so every
    instance serves the same weights."""
    return tmp_path_factory.mktemp("accord-cache")


@pytest.fixture(scope="session")
def kv_store(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("kv-store")


@pytest.fixture(scope="session")
def prefill_server(cache_dir: Path, kv_store: Path) -> Iterator[ServerProcess]:
    """An instance that saves every prompt's KV (kv_producer)."""
    process = ServerProcess(*ENGINE_FLAGS, "--kv-transfer-config", shared_storage("kv_producer", kv_store),
                            cache_dir=cache_dir)
    yield process
    process.stop()


@pytest.fixture(scope="session")
def decode_server(cache_dir: Path, kv_store: Path, prefill_server: ServerProcess) -> Iterator[ServerProcess]:
    """An instance that loads saved prompts' KV (kv_consumer), reporting cached tokens."""
    process = ServerProcess(*ENGINE_FLAGS, "--enable-prompt-tokens-details",
                            "--kv-transfer-config", shared_storage("kv_consumer", kv_store), cache_dir=cache_dir)
    yield process
    process.stop()


@pytest.fixture
def doomed_decode_server(cache_dir: Path, kv_store: Path, prefill_server: ServerProcess) -> Iterator[ServerProcess]:
    """A kv_consumer instance of the test's own, for a test that kills it."""
    process = ServerProcess(*ENGINE_FLAGS, "--kv-transfer-config", shared_storage("kv_consumer", kv_store),
                            cache_dir=cache_dir)
    yield process
    process.stop()


class RunningRouter:
    """`accord router FLAGS` (the command's own parser and app) served by uvicorn on a
    thread of the test process: no interpreter start per router."""

    def __init__(self, *flags: str) -> None:
        port = free_port()
        self.url = f"http://127.0.0.1:{port}"
        args = build_parser().parse_args(["router", "--port", str(port), *flags])
        config = uvicorn.Config(build_app(router_config(args)), host="127.0.0.1", port=port, log_level="warning")
        self.server = uvicorn.Server(config)
        self._thread = threading.Thread(target=self.server.run, daemon=True)
        self._thread.start()
        end = time.monotonic() + STARTUP_TIMEOUT_S
        while not self.server.started:
            if not self._thread.is_alive() or time.monotonic() > end:
                raise RuntimeError("accord router did not start")
            time.sleep(0.02)

    def stop(self) -> None:
        self.server.should_exit = True
        self._thread.join(timeout=30)


@pytest.fixture
def start_router() -> Iterator:
    """Start routers with the given flags; all are stopped after the test."""
    routers: list[RunningRouter] = []

    def start(*flags: str) -> RunningRouter:
        routers.append(RunningRouter(*flags))
        return routers[-1]

    yield start
    for router in routers:
        router.stop()


class DyingUpstream:
    """An HTTP server on loopback whose /health answers 200 and which dies on every
    other request: at once, before answering (`streams_first_event` False), or after
    the status line, SSE headers and one event of a chunked body (an instance that
    dies once its stream began). Nothing depends on timing."""

    FIRST_EVENT = b'data: {"choices": [{"index": 0, "text": "A"}]}\n\n'

    def __init__(self, streams_first_event: bool) -> None:
        self.streams_first_event = streams_first_event
        self.generation_requests = 0
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.url = f"http://127.0.0.1:{self.listener.getsockname()[1]}"
        self._thread = threading.Thread(target=self._serve, daemon=True)
        self._thread.start()

    def _serve(self) -> None:
        while True:
            try:
                connection, _ = self.listener.accept()
            except OSError:
                return
            with connection:
                request = connection.recv(65536)
                if request.startswith(b"GET /health"):
                    connection.sendall(b"HTTP/1.1 200 OK\r\ncontent-length: 0\r\nconnection: close\r\n\r\n")
                    continue
                self.generation_requests += 1
                if self.streams_first_event:
                    head = b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\ntransfer-encoding: chunked\r\n\r\n"
                    connection.sendall(head + b"%x\r\n" % len(self.FIRST_EVENT) + self.FIRST_EVENT + b"\r\n")
                # Closed mid-body: the client reads what was sent, then the end of a cut stream
                # (a reset could discard the sent event before the router reads it).

    def close(self) -> None:
        self.listener.close()


@pytest.fixture
def dying_upstream() -> Iterator:
    """Make DyingUpstreams; all are closed after the test."""
    upstreams: list[DyingUpstream] = []

    def make(streams_first_event: bool) -> DyingUpstream:
        upstreams.append(DyingUpstream(streams_first_event))
        return upstreams[-1]

    yield make
    for upstream in upstreams:
        upstream.close()
