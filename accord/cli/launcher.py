"""Runs `accord serve`: loads the engine (on the backend named by --backend), builds the
app and serves it with uvicorn until SIGTERM (graceful, exit 0) or SIGINT. If the
engine dies (a worker process gone), /health answers 503 and, after a short grace for
probes and in-flight responses, the server stops with exit status 1."""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import logging
import signal
import socket
import sys
import time
from collections.abc import Iterator

import uvicorn

from ..backends.registry import BackendUnavailableError
from ..core.engine.async_llm import AsyncLLM
from ..core.engine.llm_engine import LLMEngine
from ..core.errors import WorkerStartupError
from ..entrypoints import RegistryBackend
from ..server.app import create_app
from ..server.drain import DrainDeadline
from .engine_flags import engine_config
from ..demo.default_model import ChecksumMismatch, DefaultModelUnavailable
from ..entrypoints.model_choice import choose_model
from ..server.options import ServerOptions
from ..server.serving import ServedModel


logger = logging.getLogger("accord.server")

#: Seconds a server whose engine died keeps answering (/health 503, errors to
#: in-flight requests) before it exits with status 1.
DEAD_ENGINE_EXIT_DELAY_S = 5.0


#: Time left, at the end of the drain window, for cut requests to send their last
#: event or error body before uvicorn cancels what remains.
DRAIN_MARGIN_S = 0.5


class GracefulServer(uvicorn.Server):
    """uvicorn's server, except that a SIGTERM ends with exit status 0 and requests
    that outlive the drain window end cleanly.

    On SIGTERM uvicorn stops accepting connections, waits up to
    `timeout_graceful_shutdown` for in-flight requests, cancels the rest and runs the
    lifespan shutdown. Cancelling would cut streams without a word and give whole
    responses a plain-text 500, so shortly before that the drain deadline expires:
    streams end with an error event and `[DONE]`, whole responses with a JSON 503.
    Then uvicorn re-raises the signal so the process dies by it; an orchestrator reads
    that as a crash, so SIGTERM is dropped from the signals it re-raises.
    """

    def __init__(self, config: uvicorn.Config, engine: AsyncLLM, drain: DrainDeadline) -> None:
        super().__init__(config)
        self.engine = engine
        self.drain = drain
        self.exit_code = 0
        self._dead_since: float | None = None

    async def shutdown(self, sockets: list[socket.socket] | None = None) -> None:
        timeout = self.config.timeout_graceful_shutdown
        if timeout is not None:
            margin = min(DRAIN_MARGIN_S, timeout / 2)
            asyncio.get_running_loop().call_later(timeout - margin, self.drain.expire)
        await super().shutdown(sockets)

    @contextlib.contextmanager
    def capture_signals(self) -> Iterator[None]:
        with super().capture_signals():
            yield
            # uvicorn re-raises what this (private) list holds once the block exits.
            self._captured_signals = [s for s in self._captured_signals if s != signal.SIGTERM]

    async def on_tick(self, counter: int) -> bool:
        """uvicorn's 10 Hz housekeeping, plus: stop (exit status 1) once the engine
        has been dead for DEAD_ENGINE_EXIT_DELAY_S."""
        if self.engine.errored:
            now = time.monotonic()
            if self._dead_since is None:
                self._dead_since = now
                logger.error("the engine is dead; exiting in %.0f s", DEAD_ENGINE_EXIT_DELAY_S)
            elif now - self._dead_since >= DEAD_ENGINE_EXIT_DELAY_S:
                self.exit_code = 1
                return True
        return await super().on_tick(counter)


def listen_tcp(host: str, port: int) -> socket.socket:
    """A TCP socket listening on `host`:`port`, made with its protocol named.

    `socket.create_server` leaves the protocol 0, and asyncio turns Nagle's algorithm
    off only on connections whose socket says IPPROTO_TCP. With it on, every response
    after a connection's first waited about 40 ms for the client's delayed ACK (uvicorn
    writes the headers and the body apart), and so did each streamed chunk."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    listener = socket.socket(family, socket.SOCK_STREAM, socket.IPPROTO_TCP)
    try:
        listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        listener.bind((host, port))
        listener.listen()
    except OSError:
        listener.close()
        raise
    return listener


def serve(args: argparse.Namespace, options: ServerOptions) -> int:
    """Serve the model the parsed `accord serve` flags describe, with the server
    settings `options` (read from the same flags); returns the exit code."""
    try:
        # Bound first: a port in use fails now, before the model loads and long
        # before anything claims to be serving.
        listener = listen_tcp(args.host, args.port)
    except OSError as error:
        print(f"accord serve: error: cannot listen on {args.host}:{args.port}: {error.strerror}", file=sys.stderr)
        return 1
    with listener:
        return _serve_on(args, options, listener)


def _serve_on(args: argparse.Namespace, options: ServerOptions, listener: socket.socket) -> int:
    try:
        choice = choose_model(args.model)
    except (ChecksumMismatch, DefaultModelUnavailable) as error:
        print(f"accord serve: error: {error}", file=sys.stderr)
        return 1
    try:
        settings = engine_config(args, choice.path)
        if settings.kv_cache_memory is None:
            settings.kv_cache_memory = choice.kv_cache_memory
        backend = RegistryBackend(settings.backend, str(settings.model), settings.quantization,
                                  settings.speculative_config is not None, settings.enable_lora)
        llm_engine = LLMEngine(settings, backend)
        engine = AsyncLLM(llm_engine)
    except (ValueError, LookupError, OSError, BackendUnavailableError, WorkerStartupError) as error:
        # A wrong directory, flag or backend: say what, without a traceback.
        print(f"accord serve: error: {error}", file=sys.stderr)
        return 1
    names = args.served_model_name or [choice.name]
    model = ServedModel(
        name=names[0],
        aliases=tuple(names[1:]),
        root=choice.path,
        max_model_len=engine.max_model_len,
        vocab_size=engine.model_config.vocab_size,
        description=choice.description,
        scheduling_policy=settings.scheduling_policy,
    )
    drain = DrainDeadline()
    try:
        app = create_app(engine, model, options, drain)
    except ValueError as error:  # an unknown tool call parser
        print(f"accord serve: error: {error}", file=sys.stderr)
        llm_engine.shutdown()
        return 1
    server_config = uvicorn.Config(
        app, host=args.host, port=args.port, log_level=args.uvicorn_log_level,
        timeout_graceful_shutdown=args.shutdown_timeout,
    )
    url = f"http://{args.host}:{args.port}/v1"
    ranks = ""
    if settings.world_size > 1:
        ranks = f" x{settings.world_size} ranks (TP {settings.tensor_parallel_size} x DP {settings.data_parallel_size})"
    print(f"accord: serving {model.name} on backend {llm_engine.backend_name}{ranks} at {url}", file=sys.stderr, flush=True)
    server = GracefulServer(server_config, engine, drain)
    try:
        server.run(sockets=[listener])
    finally:
        llm_engine.shutdown()
    return server.exit_code
