"""The gate's command-line side: a config or backend that cannot be used exits 2 with
the reason, and --list prints the plan without running anything."""

from __future__ import annotations

from pathlib import Path

import pytest
from gate_helpers import write_deploy_yaml

from accord.gate.gate_command import EXIT_ERROR, EXIT_PASSED, run_deploy


def test_a_config_with_an_unknown_key_exits_2_naming_the_key(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    deploy = write_deploy_yaml(tmp_path / "deploy.yaml", tmp_path, max_num_seq=4)
    assert run_deploy(deploy) == EXIT_ERROR
    assert "unknown key(s) max_num_seq" in capsys.readouterr().err


def test_an_unknown_backend_exits_2_listing_the_known_ones(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    deploy = write_deploy_yaml(tmp_path / "deploy.yaml", tmp_path, backend="nope")
    assert run_deploy(deploy) == EXIT_ERROR
    assert "Unsupported backend: nope" in capsys.readouterr().err


def test_list_prints_the_plan_without_running_it(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    # The model directory does not exist: running anything would fail preflight.
    deploy = write_deploy_yaml(tmp_path / "deploy.yaml", tmp_path / "absent")
    assert run_deploy(deploy, ops=["rms_norm"], list_only=True) == EXIT_PASSED
    printed = capsys.readouterr().out
    assert "profile_run at max_num_seqs=4 max_num_batched_tokens=32" in printed
    assert "rms_norm  [x,weight=bf16]" in printed


def test_backend_flag_overrides_the_configs_backend(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    deploy = write_deploy_yaml(tmp_path / "deploy.yaml", tmp_path / "absent", backend="cpu")
    run_deploy(deploy, backend="reference", list_only=True)
    assert "on backend 'reference'" in capsys.readouterr().out
