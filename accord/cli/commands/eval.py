"""`accord eval`: model quality through the engine's own forward. `accord eval
perplexity` scores a text as llama.cpp's `llama-perplexity` does (accord/eval/perplexity.py),
with every engine flag `accord serve` takes (--dtype, --kv-cache-dtype, --quantization,
--backend, ...); a GGUF file is computed packed, as served (ACCORD_GGUF_PACKED=0: dequantised)."""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys
from pathlib import Path

from ...eval.perplexity import DEFAULT_CTX_SIZE, PerplexityInputError, check_window_settings, measure_perplexity
from ..engine_flags import add_engine_flags, engine_arguments


def add_parser(subparsers: argparse._SubParsersAction) -> None:
    """Add `accord eval` and its subcommand `perplexity`."""
    parser = subparsers.add_parser("eval", help="model quality through the engine: perplexity over a text")
    commands = parser.add_subparsers(dest="eval_command", metavar="{perplexity}", required=True)
    perplexity = commands.add_parser(
        "perplexity",
        help="perplexity over a text file, chunked and scored as llama.cpp's llama-perplexity",
        description=(
            "Tokenise FILE, cut it into chunks of --ctx-size tokens, score the second half of each chunk with the "
            "engine's prompt logprobs, and print PPL = exp(mean NLL) with its standard error, as llama-perplexity "
            "does. The model defaults to SmolLM2-135M-Instruct (accord serve's default)."
        ),
    )
    group = perplexity.add_argument_group("perplexity")
    group.add_argument("--text", required=True, type=Path, metavar="FILE", help="the UTF-8 text to score")
    group.add_argument(
        "--ctx-size", type=int, default=DEFAULT_CTX_SIZE,
        help="tokens per chunk, llama-perplexity's -c (default: %(default)s)",
    )
    group.add_argument(
        "--chunks", type=int, default=None,
        help="score at most this many chunks from the start, llama-perplexity's --chunks (default: all)",
    )
    group.add_argument("--json", action="store_true", help="print the result as one JSON object")
    add_engine_flags(perplexity.add_argument_group("engine (vLLM's flag names)"))
    perplexity.set_defaults(func=run_perplexity)


def _error(message: object) -> None:
    print(f"accord eval perplexity: error: {message}", file=sys.stderr)


def run_perplexity(args: argparse.Namespace) -> int:
    """Load the model, score the text, print the result; 2 for unusable input, 1 for a
    model that cannot load."""
    try:
        text = args.text.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as error:
        _error(f"cannot read --text {args.text}: {error}")
        return 2
    if not text.strip():
        _error(f"--text {args.text} is empty")
        return 2
    try:
        check_window_settings(args.ctx_size, args.chunks)
    except PerplexityInputError as error:  # refused before minutes of model loading
        _error(error)
        return 2
    # The engine (and the default model's download) load only when the command runs.
    from ... import LLM
    from ...backends.registry import BackendUnavailableError
    from ...core.errors import WorkerStartupError
    from ...demo.default_model import DEFAULT_MODEL_NAME, ChecksumMismatch, DefaultModelUnavailable

    arguments = engine_arguments(args)
    if arguments.get("max_model_len") is None:
        arguments["max_model_len"] = args.ctx_size + 1  # a chunk and the one token the engine samples
    try:
        llm = LLM(args.model or DEFAULT_MODEL_NAME, **arguments)
    except (ValueError, LookupError, OSError, BackendUnavailableError, WorkerStartupError, ChecksumMismatch,
            DefaultModelUnavailable) as error:
        _error(error)
        return 1
    try:
        result = measure_perplexity(llm, text, args.ctx_size, args.chunks)
    except PerplexityInputError as error:
        _error(error)
        return 2
    finally:
        llm.llm_engine.shutdown()
    if args.json:
        print(json.dumps({"model": args.model or DEFAULT_MODEL_NAME, **dataclasses.asdict(result)}))
    else:
        print(f"PPL = {result.ppl:.4f} +/- {result.stderr:.5f} ({result.chunks} chunks of {result.ctx_size} tokens, "
              f"{result.scored_tokens} tokens scored of {result.text_tokens}; mean NLL {result.mean_nll:.6f})")
    return 0
