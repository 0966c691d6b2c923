"""Runs `accord serve`: loads the engine, builds the app and serves it with uvicorn
until SIGTERM (graceful, exit 0) or SIGINT."""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import signal
import socket
import sys
from collections.abc import Iterator

import uvicorn

from ..backends.registry import BackendUnavailableError
from ..core.async_engine import AsyncLLM
from ..core.engine import LLMEngine
from .app import create_app
from .commands.serve import engine_config
from .drain import DrainDeadline
from .demo_model import DEMO_KV_CACHE_BYTES, DEMO_MODEL_DESCRIPTION, DEMO_MODEL_NAME, demo_model_dir
from .serving import ServedModel


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

    def __init__(self, config: uvicorn.Config, drain: DrainDeadline) -> None:
        super().__init__(config)
        self.drain = drain

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


def serve(args: argparse.Namespace) -> int:
    """Serve the model the parsed `accord serve` flags describe; returns the exit code."""
    try:
        # Bound first: a port in use fails now, before the model loads and long
        # before anything claims to be serving.
        family = socket.AF_INET6 if ":" in args.host else socket.AF_INET
        listener = socket.create_server((args.host, args.port), family=family)
    except OSError as error:
        print(f"accord serve: error: cannot listen on {args.host}:{args.port}: {error.strerror}", file=sys.stderr)
        return 1
    with listener:
        return _serve_on(args, listener)


def _serve_on(args: argparse.Namespace, listener: socket.socket) -> int:
    model_dir = args.model or str(demo_model_dir())
    settings = engine_config(args, model_dir)
    if args.model is None and settings.kv_cache_memory is None:
        # The engine's CPU default (4 GiB) would dwarf the demo model and slow its start.
        settings.kv_cache_memory = DEMO_KV_CACHE_BYTES
    try:
        engine = AsyncLLM(LLMEngine(settings))
    except (ValueError, LookupError, OSError, BackendUnavailableError) as error:
        # A wrong directory, flag or backend: say what, without a traceback.
        print(f"accord serve: error: {error}", file=sys.stderr)
        return 1
    model = ServedModel(
        name=args.served_model_name or args.model or DEMO_MODEL_NAME,
        root=model_dir,
        max_model_len=engine.max_model_len,
        vocab_size=engine.model_config.vocab_size,
        description=None if args.model else DEMO_MODEL_DESCRIPTION,
        scheduling_policy=settings.scheduling_policy,
    )
    drain = DrainDeadline()
    try:
        app = create_app(
            engine, model, api_key=args.api_key, max_waiting_requests=args.max_waiting_requests,
            max_request_body_bytes=args.max_request_body_bytes, tool_call_parser=args.tool_call_parser, drain=drain,
        )
    except ValueError as error:  # an unknown tool call parser
        print(f"accord serve: error: {error}", file=sys.stderr)
        return 1
    server_config = uvicorn.Config(
        app, host=args.host, port=args.port, log_level=args.uvicorn_log_level,
        timeout_graceful_shutdown=args.shutdown_timeout,
    )
    url = f"http://{args.host}:{args.port}/v1"
    print(f"accord: serving {model.name} on backend {engine.engine.backend.name} at {url}", file=sys.stderr, flush=True)
    GracefulServer(server_config, drain).run(sockets=[listener])
    return 0
