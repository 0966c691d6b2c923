"""`accord conformance` on the command line: --report-dir writes the three reports,
--deploy runs (or with --list, plans) the gate, and `merge` builds the cross-vendor
matrix, each through the real argument parser."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import pytest
from gate_helpers import write_deploy_yaml

from accord.gate.reports import REPORT_FILES, GateReport, validate_document, write_reports
from accord.cli.main import main


def test_report_dir_writes_the_three_reports_of_an_op_run(tmp_path: Path) -> None:
    assert main(["conformance", "--op", "silu_and_mul", "--report-dir", str(tmp_path)]) == 0
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted(REPORT_FILES)
    validate_document(json.loads((tmp_path / "report.json").read_text()))


def test_deploy_with_list_prints_the_plan(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    deploy = write_deploy_yaml(tmp_path / "deploy.yaml", tmp_path / "model")
    assert main(["conformance", "--deploy", str(deploy), "--list", "--op", "rms_norm"]) == 0
    assert "profile_run at max_num_seqs=4" in capsys.readouterr().out


def test_merge_subcommand_writes_the_cross_vendor_reports(small_report: GateReport, tmp_path: Path) -> None:
    other = dataclasses.replace(small_report, environment={**small_report.environment, "backend": "rocm"})
    files = [str(write_reports(report, tmp_path / report.backend)[0]) for report in (small_report, other)]
    assert main(["conformance", "merge", *files, "--report-dir", str(tmp_path / "merged")]) == 0
    assert json.loads((tmp_path / "merged" / "report.json").read_text())["columns"] == ["cpu", "rocm"]
