"""Preflight: before anything loads, the block size must be one the backend takes, an
fp8 KV cache one its cache kernels accept, and a kept recording folder free of an
earlier run's calls. (A model that cannot be read is a bad config, refused before
preflight: test_gate_model_sources.py.)"""

from __future__ import annotations

from pathlib import Path

from gate_backends import ReferenceVariant, cache_writers_without_fp8
from gate_helpers import record_an_earlier_run

from accord.backends import Backend, get_backend
from accord.core.model_loader.load import read_model_config
from accord.gate.deploy_config import DeployConfig, parse_deploy_config
from accord.gate.preflight import preflight_checks
from accord.gate.reports import Check, CheckStatus


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


def preflight(deploy: DeployConfig, backend: Backend) -> dict[str, str]:
    """The failed preflight checks of `deploy` (its model read from disk) on `backend`."""
    return failed(preflight_checks(deploy, backend, read_model_config(deploy.engine.model)))


def test_a_sound_config_passes_every_preflight_check(tiny_model: Path) -> None:
    assert preflight(config(tiny_model), get_backend("cpu")) == {}


def test_an_fp8_cache_passes_on_a_backend_whose_kernels_store_it(tiny_model: Path) -> None:
    assert preflight(config(tiny_model, kv_cache_dtype="fp8"), get_backend("cpu")) == {}


def test_an_fp8_cache_fails_on_a_backend_whose_writer_refuses_it(tiny_model: Path) -> None:
    backend = ReferenceVariant("no-fp8", cache_writers_without_fp8)
    messages = preflight(config(tiny_model, kv_cache_dtype="fp8"), backend)
    assert "reshape_and_cache refuses an fp8e4m3fn cache" in messages["kv_cache_dtype"]


def test_a_block_size_the_backend_does_not_take_fails(tiny_model: Path) -> None:
    backend = SixteenTokenBlocks("sixteen", lambda kernels: None)
    messages = preflight(config(tiny_model, block_size=32), backend)
    assert messages["block_size"] == "block_size=32 but backend 'sixteen' takes [16]"


def test_a_kept_recording_folder_holding_an_earlier_run_is_refused(tiny_model: Path, tmp_path: Path) -> None:
    earlier = record_an_earlier_run(tmp_path / "calls")
    checks = preflight(config(tiny_model, record_op_calls=str(earlier)), get_backend("cpu"))
    assert list(checks) == ["record_op_calls"] and "earlier run" in checks["record_op_calls"]
    assert preflight(config(tiny_model, record_op_calls=str(tmp_path / "new")), get_backend("cpu")) == {}
