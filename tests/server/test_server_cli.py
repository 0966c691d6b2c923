"""`accord serve`'s command line: vLLM's engine flag names, complete help, and flags
that reach the engine configuration."""

from __future__ import annotations

import contextlib
import io
import subprocess
import sys
from pathlib import Path

import pytest

from accord.cli.main import build_parser
from accord.cli.engine_flags import engine_config

VLLM_FLAGS = (
    "--model", "--backend", "--host", "--port", "--api-key", "--max-num-seqs", "--max-num-batched-tokens",
    "--block-size", "--enable-prefix-caching", "--no-enable-prefix-caching", "--kv-cache-dtype", "--dtype",
    "--quantization", "--served-model-name", "--max-model-len", "--seed", "--scheduling-policy",
    "--max-waiting-requests", "--shutdown-timeout",
)


@pytest.fixture(scope="module")
def serve_help() -> str:
    output = io.StringIO()
    with contextlib.redirect_stdout(output), pytest.raises(SystemExit):
        build_parser().parse_args(["serve", "--help"])
    return output.getvalue()


@pytest.mark.parametrize("flag", VLLM_FLAGS)
def test_serve_help_documents_the_flag(serve_help: str, flag: str) -> None:
    assert f"{flag} " in serve_help or f"{flag}\n" in serve_help


def test_top_level_help_lists_serve() -> None:
    assert "serve" in build_parser().format_help()


def test_engine_flags_reach_the_engine_config() -> None:
    args = build_parser().parse_args(
        ["serve", "--max-num-seqs", "7", "--block-size", "32", "--no-enable-prefix-caching", "--kv-cache-dtype", "fp8",
         "--scheduling-policy", "priority", "--kv-cache-memory-bytes", "1048576", "--backend", "reference"]
    )
    config = engine_config(args, "/models/tiny")
    assert (config.model, config.max_num_seqs, config.block_size) == ("/models/tiny", 7, 32)
    assert (config.enable_prefix_caching, config.kv_cache_dtype, config.scheduling_policy) == (False, "fp8", "priority")
    assert (config.kv_cache_memory, config.backend) == (1 << 20, "reference")


def test_engine_defaults_are_the_engine_configs_defaults() -> None:
    from accord.core.config import EngineConfig

    args = build_parser().parse_args(["serve"])
    assert engine_config(args, "/models/tiny") == EngineConfig(model="/models/tiny")



@pytest.mark.slow
def test_serving_a_missing_directory_fails_with_a_one_line_error(tmp_path: Path) -> None:
    missing = tmp_path / "no-such-model"
    result = subprocess.run(
        [sys.executable, "-m", "accord", "serve", "--model", str(missing)],
        capture_output=True, text=True, timeout=120,
    )
    assert result.returncode == 1
    assert result.stderr.startswith("accord serve: error:") and str(missing) in result.stderr
    assert "Traceback" not in result.stderr


@pytest.mark.parametrize("env, expected", [({"VLLM_API_KEY": "v"}, ["v"]),
                                           ({"VLLM_API_KEY": "v", "ACCORD_API_KEY": "a"}, ["a"]), ({}, None)])
def test_the_api_key_comes_from_vllms_environment_variable_too(monkeypatch, env: dict, expected) -> None:
    # vLLM reads VLLM_API_KEY when --api-key is absent; a vLLM deployment's environment keeps working.
    for name in ("VLLM_API_KEY", "ACCORD_API_KEY"):
        monkeypatch.delenv(name, raising=False)
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    assert build_parser().parse_args(["serve"]).api_key == expected
