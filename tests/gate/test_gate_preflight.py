"""Preflight: before anything loads, the model directory must be readable, the block
size one the backend takes, an fp8 KV cache one its cache kernels accept, and a kept
recording folder free of an earlier run's calls."""

from __future__ import annotations

from pathlib import Path

import torch
from gate_backends import ReferenceVariant, cache_writers_without_fp8

from accord.backends import get_backend
from accord.gate.deploy_config import DeployConfig, parse_deploy_config
from accord.gate.preflight import preflight_checks
from accord.gate.reports import Check, CheckStatus
from accord.op_contracts import OpDispatcher
from accord.op_contracts.recording import CallRecorder, rank_directory


class SixteenTokenBlocks(ReferenceVariant):
    """A backend whose attention kernels take 16-token KV blocks only."""

    def supported_block_sizes(self) -> tuple[int, ...]:
        """Only 16."""
        return (16,)


def config(model: Path, **settings: object) -> DeployConfig:
    """A deploy config for `model` with `settings`."""
    return parse_deploy_config({"model": str(model), **settings}, model)


def failed(checks: list[Check]) -> dict[str, str]:
    """Failed checks' messages by name."""
    return {check.name: check.message for check in checks if check.status is CheckStatus.FAIL}


def test_a_sound_config_passes_every_preflight_check(tiny_model: Path) -> None:
    assert failed(preflight_checks(config(tiny_model), get_backend("cpu"))) == {}


def test_an_fp8_cache_passes_on_a_backend_whose_kernels_store_it(tiny_model: Path) -> None:
    assert failed(preflight_checks(config(tiny_model, kv_cache_dtype="fp8"), get_backend("cpu"))) == {}


def test_an_fp8_cache_fails_on_a_backend_whose_writer_refuses_it(tiny_model: Path) -> None:
    backend = ReferenceVariant("no-fp8", cache_writers_without_fp8)
    messages = failed(preflight_checks(config(tiny_model, kv_cache_dtype="fp8"), backend))
    assert "reshape_and_cache refuses an fp8e4m3fn cache" in messages["kv_cache_dtype"]


def test_a_missing_model_directory_fails_naming_it(tmp_path: Path) -> None:
    messages = failed(preflight_checks(config(tmp_path / "nowhere"), get_backend("cpu")))
    assert str(tmp_path / "nowhere") in messages["model directory"]


def test_a_block_size_the_backend_does_not_take_fails(tiny_model: Path) -> None:
    backend = SixteenTokenBlocks("sixteen", lambda kernels: None)
    messages = failed(preflight_checks(config(tiny_model, block_size=32), backend))
    assert messages["block_size"] == "block_size=32 but backend 'sixteen' takes [16]"


def test_a_kept_recording_folder_holding_an_earlier_run_is_refused(tiny_model: Path, tmp_path: Path) -> None:
    earlier = tmp_path / "calls"
    ops = OpDispatcher(get_backend("cpu"))
    ops.add_hook(CallRecorder(rank_directory(earlier, 0)))
    ops.rms_norm(torch.ones(2, 8), torch.ones(8), eps=1e-6)
    checks = failed(preflight_checks(config(tiny_model, record_op_calls=str(earlier)), get_backend("cpu")))
    assert list(checks) == ["record_op_calls"] and "earlier run" in checks["record_op_calls"]
    assert failed(preflight_checks(config(tiny_model, record_op_calls=str(tmp_path / "new")), get_backend("cpu"))) == {}
