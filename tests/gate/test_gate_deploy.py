"""The rollout gate end to end on a tiny random model: a sound deploy config on the
cpu backend passes and writes all three reports; a backend plugin with a bug in one
kernel fails the gate with that op named in every report, and one that crashes in
profile_run has the crashing call replayed and named; a kv_cache_dtype the backend
cannot serve fails before anything is generated."""

from __future__ import annotations

import json
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest
from gate_backends import BUGGY_BACKEND, BUGGY_OP, CRASHING_BACKEND, NO_FP8_CACHE_BACKEND
from gate_browser import needs_chromium, rendered_matrix
from gate_helpers import gate_in_subprocess, write_deploy_yaml

from accord.gate.gate_command import EXIT_FAILED, EXIT_PASSED, run_deploy
from accord.gate.reports import REPORT_FILES, validate_document

# Every test here runs the gate end to end.
pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def cpu_gate(tiny_model: Path, tmp_path_factory: pytest.TempPathFactory) -> tuple[int, Path]:
    """The gate run once on the cpu backend: (exit code, report folder)."""
    folder = tmp_path_factory.mktemp("cpu-gate")
    deploy = write_deploy_yaml(folder / "deploy.yaml", tiny_model)
    return run_deploy(deploy, report_dir=folder / "reports"), folder / "reports"


@pytest.fixture(scope="module")
def cpu_document(cpu_gate: tuple[int, Path]) -> dict:
    """The cpu run's report.json."""
    return json.loads((cpu_gate[1] / "report.json").read_text())


def test_a_sound_config_on_the_cpu_backend_passes(cpu_gate: tuple[int, Path]) -> None:
    assert cpu_gate[0] == EXIT_PASSED


def test_the_gate_writes_all_three_reports(cpu_gate: tuple[int, Path], cpu_document: dict) -> None:
    assert sorted(path.name for path in cpu_gate[1].iterdir()) == sorted(REPORT_FILES)
    validate_document(cpu_document)
    assert ET.parse(cpu_gate[1] / "junit.xml").getroot().get("failures") == "0"
    assert "<table id=\"matrix\">" in (cpu_gate[1] / "report.html").read_text()


@needs_chromium
def test_the_gate_html_opens_in_chromium_with_a_row_per_called_op(cpu_gate: tuple[int, Path], tmp_path: Path) -> None:
    reader = rendered_matrix(cpu_gate[1] / "report.html", tmp_path / "profile")
    assert {"rms_norm", "paged_attention", "silu_and_mul", "sample"} <= set(reader.rows)


def test_the_report_pins_the_deploy_config_and_its_hash(cpu_document: dict, tiny_model: Path) -> None:
    environment = cpu_document["environment"]
    assert environment["deploy_config"]["model"] == str(tiny_model)
    assert environment["deploy_config"]["max_num_batched_tokens"] == 32
    assert environment["deploy_config_hash"].startswith("sha256:")


def test_op_conformance_runs_the_signatures_recorded_while_generating(cpu_document: dict) -> None:
    recorded = {r["op"] for r in cpu_document["conformance"]["results"] if r["case"].startswith("recorded ")}
    assert {"rms_norm", "paged_attention", "reshape_and_cache", "silu_and_mul"} <= recorded


def test_the_model_level_checks_ran_and_passed(cpu_document: dict) -> None:
    checks = {c["name"]: c for c in cpu_document["checks"]}
    for name in ("profile_run", "greedy comparison with the reference",
                 "first streamed token equals non-streamed token 0",
                 "at most one terminal EOS", "usage.completion_tokens equals tokens produced"):
        assert checks[name]["status"] == "pass", checks[name]
    assert checks["greedy comparison with the reference"]["figures"]["token_agreement"] == 1.0


@pytest.fixture(scope="module")
def buggy_gate(tiny_model: Path, tmp_path_factory: pytest.TempPathFactory) -> tuple[int, Path]:
    """The gate on the backend whose silu_and_mul is ten percent off."""
    folder = tmp_path_factory.mktemp("buggy-gate")
    deploy = write_deploy_yaml(folder / "deploy.yaml", tiny_model, backend=BUGGY_BACKEND,
                               gate={"standard_cases": False, "server_checks": False})
    return gate_in_subprocess(folder, deploy)


def test_a_kv_cache_dtype_the_backend_cannot_serve_fails_before_generation(tiny_model: Path, tmp_path: Path) -> None:
    deploy = write_deploy_yaml(tmp_path / "deploy.yaml", tiny_model, backend=NO_FP8_CACHE_BACKEND, kv_cache_dtype="fp8")
    exit_code, reports = gate_in_subprocess(tmp_path, deploy)
    document = json.loads((reports / "report.json").read_text())
    (refused,) = [c for c in document["checks"] if c["status"] == "fail"]
    assert exit_code == EXIT_FAILED
    assert refused["name"] == "kv_cache_dtype"
    assert "fp8 caches are not implemented" in refused["message"]
    assert document["conformance"] is None
    assert "profile_run" not in {c["name"] for c in document["checks"]}


def test_a_kernel_crashing_in_profile_run_fails_it_and_is_named_at_the_crashing_shape(
    tiny_model: Path, tmp_path: Path
) -> None:
    deploy = write_deploy_yaml(tmp_path / "deploy.yaml", tiny_model, backend=CRASHING_BACKEND)
    exit_code, reports = gate_in_subprocess(tmp_path, deploy)
    document = json.loads((reports / "report.json").read_text())
    checks = {c["name"]: c for c in document["checks"]}
    failed = [r for r in document["conformance"]["results"] if r["status"] == "fail"]
    assert exit_code == EXIT_FAILED
    assert checks["profile_run"]["status"] == "fail" and "illegal memory access" in checks["profile_run"]["message"]
    # The recorded shape names the crash; conformance's adversarial draws of more rows
    # than the kernel survives crash too, and nothing else fails.
    assert {r["op"] for r in failed} == {BUGGY_OP}
    assert [r["case"] for r in failed if r["case"].startswith("recorded ")][0].startswith("recorded x=[32,")
    assert all("illegal memory access" in r["message"] for r in failed), [r["message"] for r in failed]


def test_a_kernel_bug_fails_the_gate(buggy_gate: tuple[int, Path]) -> None:
    assert buggy_gate[0] == EXIT_FAILED


def test_the_buggy_op_is_named_in_report_json(buggy_gate: tuple[int, Path]) -> None:
    document = json.loads((buggy_gate[1] / "report.json").read_text())
    failed_ops = {r["op"] for r in document["conformance"]["results"] if r["status"] == "fail"}
    assert failed_ops == {BUGGY_OP}
    assert document["passed"] is False


def test_the_buggy_op_is_named_in_junit_xml(buggy_gate: tuple[int, Path]) -> None:
    cases = ET.parse(buggy_gate[1] / "junit.xml").getroot().findall("testsuite/testcase")
    failed = {case.get("classname") for case in cases if case.find("failure") is not None}
    assert f"{BUGGY_BACKEND}.{BUGGY_OP}" in failed


def test_the_buggy_op_is_named_in_report_html(buggy_gate: tuple[int, Path]) -> None:
    html = (buggy_gate[1] / "report.html").read_text()
    assert f'<tr data-op="{BUGGY_OP}">' in html
    row = html.split(f'<tr data-op="{BUGGY_OP}">', 1)[1].split("</tr>", 1)[0]
    assert 'class="fail"' in row
