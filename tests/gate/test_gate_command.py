"""The gate's command-line side: a config or backend that cannot be used exits 2 with
the reason and writes no report, a failed check exits 1 and the printout starts with
the verdict and the failure, and --list prints the plan without running anything."""

from __future__ import annotations

from pathlib import Path

import pytest
from gate_helpers import record_an_earlier_run, write_deploy_yaml

from accord.gate.gate_command import EXIT_ERROR, EXIT_FAILED, EXIT_PASSED, run_deploy


def test_a_config_with_an_unknown_key_exits_2_naming_the_key(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    deploy = write_deploy_yaml(tmp_path / "deploy.yaml", tmp_path, max_num_seq=4)
    assert run_deploy(deploy) == EXIT_ERROR
    assert "unknown key(s) max_num_seq" in capsys.readouterr().err


def test_an_unreadable_yaml_file_exits_2(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    deploy = tmp_path / "deploy.yaml"
    deploy.write_text("model: [unclosed\n")
    assert run_deploy(deploy, report_dir=tmp_path / "reports") == EXIT_ERROR
    assert f"{deploy}: cannot read" in capsys.readouterr().err
    assert not (tmp_path / "reports").exists()


def test_a_deploy_file_that_does_not_exist_exits_2(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert run_deploy(tmp_path / "absent.yaml") == EXIT_ERROR
    assert "absent.yaml: cannot read" in capsys.readouterr().err


def test_a_bad_value_exits_2_naming_the_setting(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    deploy = write_deploy_yaml(tmp_path / "deploy.yaml", tmp_path, max_num_seqs="many")
    assert run_deploy(deploy) == EXIT_ERROR
    assert "max_num_seqs must be an integer, got 'many'" in capsys.readouterr().err


def test_a_missing_model_exits_2_naming_it_and_writes_no_report(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    deploy = write_deploy_yaml(tmp_path / "deploy.yaml", tmp_path / "absent", backend="cpu")
    assert run_deploy(deploy, report_dir=tmp_path / "reports") == EXIT_ERROR
    assert f"{deploy}: model '{tmp_path / 'absent'}'" in capsys.readouterr().err
    assert not (tmp_path / "reports").exists()


def test_a_failed_check_exits_1_and_the_printout_starts_with_it(
    tiny_model: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    earlier = record_an_earlier_run(tmp_path / "calls")  # preflight refuses to mix its calls with this run's
    deploy = write_deploy_yaml(tmp_path / "deploy.yaml", tiny_model, record_op_calls=str(earlier))
    assert run_deploy(deploy, report_dir=tmp_path / "reports") == EXIT_FAILED
    first, second = capsys.readouterr().out.splitlines()[:2]
    assert first == "GATE FAILED (backend 'cpu')"
    assert second.startswith("  preflight/record_op_calls:") and "earlier run" in second
    assert (tmp_path / "reports" / "report.json").is_file()


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
