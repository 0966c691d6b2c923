"""The example rollout pipeline users copy: the example deploy config is valid, the
cpu one passes the real gate on this machine and writes its reports, and
ci/rollout.sh runs the gate with the config and report folder and fails the rollout
exactly when the gate does."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import json
import xml.etree.ElementTree as ET

import pytest
import yaml

from accord.cli.main import main
from accord.demo.model import DEMO_MODEL_NAME, demo_model_dir
from accord.gate.deploy_config import load_deploy_config
from accord.gate.reports import REPORT_FILES, validate_document

CI = Path(__file__).resolve().parents[2] / "ci"


def fake_accord(bin_dir: Path, exit_code: int) -> Path:
    """An `accord` that records its arguments and exits with `exit_code`."""
    bin_dir.mkdir()
    script = bin_dir / "accord"
    script.write_text(f'#!/bin/sh\necho "$@" > "{bin_dir}/args"\nexit {exit_code}\n')
    script.chmod(0o755)
    return bin_dir


def rollout(tmp_path: Path, exit_code: int) -> subprocess.CompletedProcess[str]:
    """ci/rollout.sh in local mode with a fake gate exiting with `exit_code`."""
    bin_dir = fake_accord(tmp_path / "bin", exit_code)
    env = {**os.environ, "ACCORD_RUNTIME": "local", "PATH": f"{bin_dir}{os.pathsep}{os.environ['PATH']}"}
    deploy, reports = CI / "deploy.example.yaml", tmp_path / "out"
    command = [str(CI / "rollout.sh"), "registry/accord@sha256:0", str(deploy), str(reports)]
    return subprocess.run(command, env=env, capture_output=True, text=True, timeout=60)


def test_the_example_deploy_config_is_valid() -> None:
    config = load_deploy_config(CI / "deploy.example.yaml")
    assert config.engine.backend == "cuda"


def test_the_cpu_deploy_config_names_the_cpu_backend_and_the_demo_model() -> None:
    engine = load_deploy_config(CI / "deploy.cpu.yaml").engine
    assert (engine.backend, engine.model) == ("cpu", DEMO_MODEL_NAME)


@pytest.mark.slow
def test_the_cpu_deploy_config_passes_the_gate_and_writes_its_reports(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    reports = tmp_path / "gate-reports"
    assert main(["conformance", "--deploy", str(CI / "deploy.cpu.yaml"), "--report-dir", str(reports)]) == 0
    assert capsys.readouterr().out.splitlines()[0] == "GATE PASSED (backend 'cpu')"
    assert sorted(path.name for path in reports.iterdir()) == sorted(REPORT_FILES)
    document = json.loads((reports / "report.json").read_text())
    validate_document(document)
    assert document["passed"] and document["environment"]["deploy_config"]["model"] == str(demo_model_dir())
    assert {check["status"] for check in document["checks"]} <= {"pass", "warn"}
    assert ET.parse(reports / "junit.xml").getroot().get("failures") == "0"


@pytest.mark.parametrize("gate_exit", [0, 1, 2])
def test_rollout_script_exits_with_the_gates_status(tmp_path: Path, gate_exit: int) -> None:
    assert rollout(tmp_path, gate_exit).returncode == gate_exit


def test_rollout_script_runs_the_gate_with_the_config_and_report_folder(tmp_path: Path) -> None:
    rollout(tmp_path, 0)
    args = (tmp_path / "bin" / "args").read_text().split()
    assert args == ["conformance", "--deploy", str(CI / "deploy.example.yaml"), "--report-dir", str(tmp_path / "out")]


def test_the_example_workflow_runs_the_rollout_script_and_merges() -> None:
    workflow = yaml.safe_load((CI / "github-actions" / "rollout-gate.yml").read_text())
    steps = [step.get("run", "") for job in workflow["jobs"].values() for step in job.get("steps", [])]
    assert any(run.startswith("ci/rollout.sh") for run in steps)
    assert any("accord conformance merge" in run for run in steps)
