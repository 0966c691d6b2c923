"""EngineConfig is the one definition of the engine's arguments: every field is reachable
from `accord serve`'s flags (vLLM's names) and from deploy.yaml, with the same choices
and the same checks, and the modules that implement a choice agree with it."""

from __future__ import annotations

import argparse
import contextlib
import io
import json
import typing
from pathlib import Path
from typing import Any

import pytest

from accord.cli.engine_flags import engine_config
from accord.cli.main import build_parser
from accord.core import config as engine_args
from accord.core.sched.block_manager import PREFIX_HASH_ALGOS
from accord.core.config import EngineConfig, EngineSetting, engine_settings
from accord.core.executor.base import EXECUTORS
from accord.core.model_loader.model_config import DTYPES_BY_NAME
from accord.core.model_loader.load import QUANTIZATIONS
from accord.gate.deploy_config import PATH_KEYS, DeployConfigError, parse_deploy_config

SETTINGS = {setting.name: setting for setting in engine_settings()}
#: Every field but the model (which `accord serve` takes as --model and resolves itself).
OPTIONAL = [name for name, setting in SETTINGS.items() if not setting.required]
WITH_CHOICES = [name for name, setting in SETTINGS.items() if setting.choices is not None]

#: vLLM's `vllm serve` spelling of each engine argument (from vLLM's EngineArgs).
VLLM_FLAGS = {
    "tokenizer": "--tokenizer", "backend": "--backend", "dtype": "--dtype", "quantization": "--quantization",
    "max_model_len": "--max-model-len", "block_size": "--block-size", "max_num_seqs": "--max-num-seqs",
    "max_num_batched_tokens": "--max-num-batched-tokens", "enable_prefix_caching": "--enable-prefix-caching",
    "kv_cache_memory": "--kv-cache-memory-bytes", "gpu_memory_utilization": "--gpu-memory-utilization",
    "num_gpu_blocks_override": "--num-gpu-blocks-override", "kv_cache_dtype": "--kv-cache-dtype",
    "calculate_kv_scales": "--calculate-kv-scales",
    "scheduling_policy": "--scheduling-policy", "seed": "--seed",
    "prefix_caching_hash_algo": "--prefix-caching-hash-algo", "tensor_parallel_size": "--tensor-parallel-size",
    "distributed_executor_backend": "--distributed-executor-backend",
    "enable_expert_parallel": "--enable-expert-parallel", "data_parallel_size": "--data-parallel-size",
    "enforce_eager": "--enforce-eager", "max_cudagraph_capture_size": "--max-cudagraph-capture-size",
    "async_scheduling": "--async-scheduling", "speculative_config": "--speculative-config",
    "enable_lora": "--enable-lora", "max_loras": "--max-loras", "max_lora_rank": "--max-lora-rank",
    "max_cpu_loras": "--max-cpu-loras",
    "kv_transfer_config": "--kv-transfer-config", "kv_offloading_size": "--kv-offloading-size",
    # accord's own: where each rank records its op calls (the rollout gate's replay).
    "compilation_config": "--compilation-config",
    "record_op_calls": "--record-op-calls",
    # accord's own: the effort scheduling policy's lanes (docs/reasoning.md).
    "effort_lane_bounds": "--effort-lane-bounds",
    # accord's own: a tenant's cap on concurrent thinking tokens (docs/reasoning.md).
    "max_thinking_tokens_per_tenant": "--max-thinking-tokens-per-tenant",
    # accord's own, where vLLM reads VLLM_BATCH_INVARIANT (docs/batch_invariance.md).
    "batch_invariant": "--batch-invariant",
}


#: A legal value of each dict-valued engine argument.
DICT_VALUES = {
    "speculative_config": {"method": "ngram", "num_speculative_tokens": 2},
    "kv_transfer_config": {"kv_connector": "SharedStorageConnector", "kv_role": "kv_both",
                           "kv_connector_extra_config": {"shared_storage_path": "/tmp/kv"}},
}


def another_value(setting: EngineSetting) -> Any:
    """A legal value that is not the default, so reaching the config is visible."""
    if setting.choices is not None:
        return next(c for c in setting.choices if c != setting.default)
    if setting.kind is bool:
        return not setting.default
    if setting.kind is int:
        return 3 if setting.default is None else setting.default + 3
    if setting.kind is float:
        return 0.5 if setting.default is None else setting.default / 2
    if setting.kind is dict:
        return DICT_VALUES[setting.name]
    return "elsewhere"


def cli_argv(setting: EngineSetting, value: Any) -> list[str]:
    if setting.kind is bool:
        return [setting.flag if value else "--no-" + setting.flag.removeprefix("--")]
    return [setting.flag, json.dumps(value) if isinstance(value, dict) else str(value)]


def from_cli(*argv: str) -> EngineConfig:
    return engine_config(build_parser().parse_args(["serve", *argv]), "/models/m")


def from_yaml(**settings: Any) -> EngineConfig:
    return parse_deploy_config({"model": "m", **settings}, Path("/")).engine


def cli_refuses(*argv: str) -> str:
    """argparse's error message for `accord serve ARGV`."""
    errors = io.StringIO()
    with contextlib.redirect_stderr(errors), pytest.raises(SystemExit):
        build_parser().parse_args(["serve", *argv])
    return errors.getvalue()


def test_engine_flags_keep_vllms_names() -> None:
    assert {name: SETTINGS[name].flag for name in OPTIONAL} == VLLM_FLAGS
    assert from_cli("-tp", "2").tensor_parallel_size == 2
    assert from_cli("-dp", "2").data_parallel_size == 2
    assert from_cli("-O3").compilation_config == 3


@pytest.mark.parametrize("name", OPTIONAL)
def test_every_field_reaches_the_engine_config_from_the_command_line(name: str) -> None:
    setting = SETTINGS[name]
    value = another_value(setting)
    assert getattr(from_cli(*cli_argv(setting, value)), name) == value


@pytest.mark.parametrize("name", OPTIONAL)
def test_every_field_reaches_the_engine_config_from_deploy_yaml(name: str) -> None:
    value = another_value(SETTINGS[name])
    expected = "/elsewhere" if name in PATH_KEYS else value  # a path relative to the YAML's folder
    assert getattr(from_yaml(**{name: value}), name) == expected


def engine_actions() -> dict[str, argparse.Action]:
    """The argparse actions of `accord serve`'s engine group, by destination."""
    serve = build_parser()._subparsers._group_actions[0].choices["serve"]  # type: ignore[union-attr]
    group = next(g for g in serve._action_groups if g.title and g.title.startswith("engine"))
    return {action.dest: action for action in group._group_actions}


def test_the_command_line_offers_no_engine_flag_that_is_not_a_field() -> None:
    assert set(engine_actions()) == set(SETTINGS)


@pytest.mark.parametrize("name", WITH_CHOICES)
def test_command_line_and_deploy_yaml_take_the_same_choices(name: str) -> None:
    setting = SETTINGS[name]
    assert tuple(engine_actions()[name].choices) == setting.choices
    # A choice that is another name for one (vLLM's --dtype half) is read as that one.
    aliases = engine_args.DTYPE_ALIASES if name == "dtype" else {}
    for choice in setting.choices:
        assert getattr(from_cli(setting.flag, str(choice)), name) == aliases.get(choice, choice)
        assert getattr(from_yaml(**{name: choice}), name) == aliases.get(choice, choice)
    assert "invalid choice: 'not-a-choice'" in cli_refuses(setting.flag, "not-a-choice")
    with pytest.raises(DeployConfigError, match=f"{name} must be one of"):
        from_yaml(**{name: "not-a-choice"})


@pytest.mark.parametrize(
    ("name", "value", "reason"),
    [
        ("block_size", 0, "at least 1"),
        ("max_model_len", 0, "at least 1"),
        ("kv_cache_memory", 0, "at least 1"),
        ("num_gpu_blocks_override", 0, "at least 1"),
        ("tensor_parallel_size", 0, "at least 1"),
        ("gpu_memory_utilization", 0.0, "greater than 0"),
        ("gpu_memory_utilization", 1.5, "at most 1"),
    ],
)
def test_bounds_are_checked_alike_from_both(name: str, value: Any, reason: str) -> None:
    with pytest.raises(ValueError, match=f"{name} must be {reason}"):
        from_cli(SETTINGS[name].flag, str(value))
    with pytest.raises(DeployConfigError, match=f"{name} must be {reason}"):
        from_yaml(**{name: value})


@pytest.mark.parametrize(
    ("name", "value", "reason"),
    [
        ("block_size", "16", "an integer"),
        ("tensor_parallel_size", 1.5, "an integer"),
        ("gpu_memory_utilization", "0.5", "a number"),
        ("enable_prefix_caching", "yes", "true or false"),
        ("seed", True, "an integer"),
        ("kv_cache_dtype", None, "a value"),
    ],
)
def test_a_yaml_value_of_the_wrong_type_is_refused_by_name(name: str, value: Any, reason: str) -> None:
    with pytest.raises(DeployConfigError, match=f"{name} must be {reason}"):
        from_yaml(**{name: value})


def test_a_command_line_value_of_the_wrong_type_is_refused() -> None:
    assert "invalid int value" in cli_refuses("--block-size", "sixteen")
    assert "invalid float value" in cli_refuses("--gpu-memory-utilization", "most")


def test_the_modules_that_implement_a_choice_agree_with_it() -> None:
    assert set(PREFIX_HASH_ALGOS) == set(typing.get_args(engine_args.PrefixCachingHashAlgo))
    assert {*EXECUTORS, "ray"} == set(typing.get_args(engine_args.ExecutorBackend))
    assert {*DTYPES_BY_NAME, "auto", *engine_args.DTYPE_ALIASES} == set(typing.get_args(engine_args.Dtype))
    assert set(engine_args.DTYPE_ALIASES.values()) <= set(DTYPES_BY_NAME)
    assert set(QUANTIZATIONS) == {None, *typing.get_args(engine_args.Quantization)}
