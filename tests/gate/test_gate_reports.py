"""The three reports of one node's run: report.json validates against the shipped
schema and reads back, junit.xml counts one testcase per case and per check (unsupported
and skipped never as passed), report.html is one self-contained page, and every report
carries the pinned environment."""

from __future__ import annotations

import dataclasses
import json
import math
import xml.etree.ElementTree as ET
from pathlib import Path

import jsonschema
import pytest
import torch

from accord.backends import get_backend
from accord.conformance import CaseResult, Status
from accord.gate.reports import Check, CheckStatus, GateReport, load_report, write_reports
from accord.gate.reports.document import SCHEMA_DIR
from accord.gate.reports.environment import capture_environment, config_hash
from accord.gate.reports.samples import sample_tensor

SKIPPED_CHECK = Check("server checks", "server", CheckStatus.SKIPPED, "gate.server_checks is false")
FAILED_CHECK = Check("profile_run", "deploy", CheckStatus.FAIL, "RuntimeError: out of memory", {"seconds": 1.5})


def with_results(report: GateReport, *extra: CaseResult, checks: tuple[Check, ...] = ()) -> GateReport:
    """`report` with more case results and checks appended."""
    conformance = dataclasses.replace(report.conformance, results=report.conformance.results + extra)
    return dataclasses.replace(report, conformance=conformance, checks=report.checks + checks)


def written(report: GateReport, directory: Path) -> dict[str, Path]:
    """Write the three reports; their paths by file name."""
    return {path.name: path for path in write_reports(report, directory)}


def junit_cases(junit: Path) -> list[ET.Element]:
    """Every testcase of every suite."""
    return ET.parse(junit).getroot().findall("testsuite/testcase")


def test_report_json_validates_against_the_shipped_schema(small_report: GateReport, tmp_path: Path) -> None:
    document = json.loads(written(small_report, tmp_path)["report.json"].read_text())
    schema = json.loads((SCHEMA_DIR / "report.schema.json").read_text())
    jsonschema.validate(document, schema)
    assert (document["schema"], document["schema_version"]) == ("accord.conformance.report", 1)


def test_report_json_reads_back_to_the_same_results(small_report: GateReport, tmp_path: Path) -> None:
    loaded = load_report(written(small_report, tmp_path)["report.json"])
    assert loaded.results == small_report.results
    assert loaded.samples == small_report.samples


def test_non_finite_error_figures_are_written_as_null(small_report: GateReport, tmp_path: Path) -> None:
    broken = CaseResult("rms_norm", "T=1 H=8", "x,weight=fp32", Status.FAIL, "out: NaN", error=math.nan, tolerance=1e-9)
    document = json.loads(written(with_results(small_report, broken), tmp_path)["report.json"].read_text())
    assert document["conformance"]["results"][-1]["error"] is None


def test_junit_has_one_testcase_per_case_and_per_check(small_report: GateReport, tmp_path: Path) -> None:
    report = with_results(small_report, checks=(SKIPPED_CHECK,))
    cases = junit_cases(written(report, tmp_path)["junit.xml"])
    assert len(cases) == len(report.results) + len(report.checks)


def test_junit_reports_unsupported_cases_as_skipped_with_the_reason(small_report: GateReport, tmp_path: Path) -> None:
    declined = CaseResult("rms_norm", "T=3 H=8", "x,weight=fp16", Status.UNSUPPORTED, "backend 'cpu' claims fp32 only")
    cases = junit_cases(written(with_results(small_report, declined), tmp_path)["junit.xml"])
    skipped = [case.find("skipped") for case in cases if case.find("skipped") is not None]
    assert [element.get("message") for element in skipped] == ["unsupported: backend 'cpu' claims fp32 only"]


def test_junit_reports_a_skipped_check_as_skipped_not_passed(small_report: GateReport, tmp_path: Path) -> None:
    junit = written(with_results(small_report, checks=(SKIPPED_CHECK,)), tmp_path)["junit.xml"]
    case = next(c for c in junit_cases(junit) if c.get("name") == "server checks")
    assert case.find("skipped").get("message") == "gate.server_checks is false"
    assert ET.parse(junit).getroot().get("skipped") == "1"


def test_junit_names_the_op_of_a_failed_case(small_report: GateReport, tmp_path: Path) -> None:
    failed = CaseResult("silu_and_mul", "T=5 I=16", "x=fp32", Status.FAIL, "out: nmse 0.01 > 1e-09")
    junit = written(with_results(small_report, failed), tmp_path)["junit.xml"]
    failures = [case for case in junit_cases(junit) if case.find("failure") is not None]
    assert [case.get("classname") for case in failures] == ["cpu.silu_and_mul"]
    assert ET.parse(junit).getroot().get("failures") == "1"


def test_a_failed_check_fails_the_report(small_report: GateReport) -> None:
    assert small_report.passed
    assert not with_results(small_report, checks=(FAILED_CHECK,)).passed


def test_html_is_one_self_contained_page(small_report: GateReport, tmp_path: Path) -> None:
    html = written(with_results(small_report, checks=(FAILED_CHECK,)), tmp_path)["report.html"].read_text()
    assert html.startswith("<!DOCTYPE html>")
    for external in ("<script", "src=", "href=", "<link", "@import"):
        assert external not in html


def test_html_shows_a_matrix_row_per_op_and_dtype_combo(small_report: GateReport, tmp_path: Path) -> None:
    html = written(small_report, tmp_path)["report.html"].read_text()
    combos = {(r.op, r.combo) for r in small_report.results}
    assert html.count("<tr data-op=") == len(combos)


def test_environment_records_versions_device_and_the_deploy_config() -> None:
    environment = capture_environment(get_backend("cpu"), {"model": "/models/m", "block_size": 16})
    assert environment["backend"] == "cpu"
    assert environment["torch"] and environment["python"] and environment["git_commit"]
    assert environment["device_arch"] and environment["device_name"]
    assert environment["deploy_config"] == {"model": "/models/m", "block_size": 16}
    assert environment["deploy_config_hash"] == config_hash({"block_size": 16, "model": "/models/m"})


def test_config_hash_changes_with_any_setting() -> None:
    assert config_hash({"block_size": 16}) != config_hash({"block_size": 32})


def test_git_commit_comes_from_the_image_variable_when_set(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("ACCORD_GIT_COMMIT", "0123abc")
    assert capture_environment(get_backend("cpu"))["git_commit"] == "0123abc"


def test_sampling_a_tensor_past_2_24_elements_stays_in_bounds_and_evenly_spaced() -> None:
    # 22369280 elements: the size whose float32 spacing rounded the last index to numel.
    numel = 22_369_280
    values = torch.arange(numel, dtype=torch.int32)
    sampled = sample_tensor(values, 32).values
    expected = [i * (numel - 1) // 31 for i in range(32)]
    assert list(sampled) == expected and sampled[-1] == numel - 1
