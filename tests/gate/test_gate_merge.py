"""`accord conformance merge`: reports of different backends become one matrix with a
column per backend, and a case is flagged where two vendors differ from each other by
more than either differs from the reference."""

from __future__ import annotations

import dataclasses
import json
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest
from gate_helpers import SMALL_OPS

from accord.backends import get_backend
from accord.conformance import ConformanceRunner
from accord.gate.gate_command import EXIT_ERROR, EXIT_FAILED, EXIT_PASSED, op_gate_report, run_merge
from accord.gate.merge import MergeError, merge_reports
from accord.gate.reports import GateReport, MergedReport, validate_document, write_reports
from accord.gate.reports.document import OutputSample, SampledOutput
from accord.gate.reports.matrix import MatrixRow, build_matrix

REFERENCE_VALUES = (1.0, -2.0, 0.5, 4.0)


@pytest.fixture(scope="module")
def reference_report() -> GateReport:
    """The same small ops run on the reference backend itself (a second 'vendor')."""
    reference = get_backend("reference")
    return op_gate_report(ConformanceRunner(reference, reference).run(SMALL_OPS), reference, reference)


def node(report: GateReport, backend: str, offset: float | None = None, host: str = "node") -> GateReport:
    """`report` relabelled as `backend` on `host`; with `offset`, every sampled output
    of its first case is the reference's values plus `offset`."""
    environment = {**report.environment, "backend": backend, "hostname": host}
    samples = dict(report.samples)
    if offset is not None:
        key = next(iter(samples))
        reference = {"out": SampledOutput("fp32", REFERENCE_VALUES)}
        got = {"out": SampledOutput("fp32", tuple(v + offset for v in REFERENCE_VALUES))}
        samples = {key: OutputSample(got, reference)}
    return dataclasses.replace(report, environment=environment, samples=samples)


def test_merge_of_two_backends_has_a_column_per_backend(small_report: GateReport, reference_report: GateReport) -> None:
    merged = merge_reports([small_report, reference_report])
    assert merged.columns == ("cpu", "reference")


def test_merge_writes_the_three_reports_with_both_backends(
    small_report: GateReport, reference_report: GateReport, tmp_path: Path
) -> None:
    paths = {p.name: p for p in write_reports(merge_reports([small_report, reference_report]), tmp_path)}
    validate_document(json.loads(paths["report.json"].read_text()))
    suites = [suite.get("name") for suite in ET.parse(paths["junit.xml"]).getroot()]
    assert suites == [
        "conformance.cpu", "gate.cpu", "conformance.reference", "gate.reference", "conformance.cross-vendor"
    ]
    html = paths["report.html"].read_text()
    assert "<th>cpu</th>" in html and "<th>reference</th>" in html


def test_honest_kernels_do_not_disagree(small_report: GateReport, reference_report: GateReport) -> None:
    merged = merge_reports([small_report, reference_report])
    assert merged.disagreements == ()
    assert merged.passed


def test_vendors_off_in_opposite_directions_are_flagged(small_report: GateReport) -> None:
    merged = merge_reports([node(small_report, "rocm", +0.1), node(small_report, "cuda", -0.1)])
    (flag,) = merged.disagreements
    assert (flag.first, flag.second) == ("rocm", "cuda")
    assert flag.between > max(flag.first_vs_reference, flag.second_vs_reference)
    assert not merged.passed


def test_vendors_off_the_same_way_are_not_flagged(small_report: GateReport) -> None:
    merged = merge_reports([node(small_report, "rocm", +0.1), node(small_report, "cuda", +0.1)])
    assert merged.disagreements == ()


def test_rounding_noise_within_the_tolerance_is_not_flagged(small_report: GateReport) -> None:
    # A tenth of an fp32 ulp at the largest value: noise for a case judged in ulps or NMSE.
    merged = merge_reports([node(small_report, "rocm", +5e-8), node(small_report, "cuda", -5e-8)])
    assert merged.disagreements == ()


def test_two_nodes_of_one_backend_are_told_apart_by_host(small_report: GateReport) -> None:
    merged = merge_reports([node(small_report, "cuda", host="a"), node(small_report, "cuda", host="b")])
    assert merged.columns == ("cuda@a", "cuda@b")


def test_reports_of_different_seeds_are_refused(small_report: GateReport) -> None:
    reseeded = dataclasses.replace(small_report, conformance=dataclasses.replace(small_report.conformance, seed=7))
    with pytest.raises(MergeError, match="different seeds"):
        merge_reports([small_report, reseeded])


def test_merge_command_exits_non_zero_when_vendors_disagree(small_report: GateReport, tmp_path: Path) -> None:
    files = []
    for name, offset in (("rocm", +0.1), ("cuda", -0.1)):
        files.append(write_reports(node(small_report, name, offset), tmp_path / name)[0])
    assert run_merge(files, tmp_path / "merged") == EXIT_FAILED
    assert len(json.loads((tmp_path / "merged" / "report.json").read_text())["disagreements"]) == 1


def test_merge_command_passes_on_agreeing_reports(
    small_report: GateReport, reference_report: GateReport, tmp_path: Path
) -> None:
    files = [write_reports(report, tmp_path / report.backend)[0] for report in (small_report, reference_report)]
    assert run_merge(files) == EXIT_PASSED


def test_merge_command_rejects_a_file_that_is_not_a_report(tmp_path: Path) -> None:
    bogus = tmp_path / "report.json"
    bogus.write_text('{"schema": "something else"}')
    assert run_merge([bogus]) == EXIT_ERROR


def matrix_of(merged: MergedReport) -> list[MatrixRow]:
    """The merged HTML's matrix rows."""
    return build_matrix(
        [source.conformance for source in merged.sources],
        frozenset((op, combo) for op, combo, _case in merged.compared),
        frozenset((d.op, d.combo) for d in merged.disagreements),
    )


def test_matrix_rows_only_one_backend_ran_are_not_compared(
    small_report: GateReport, reference_report: GateReport
) -> None:
    rms_only = dataclasses.replace(
        reference_report, samples={k: v for k, v in reference_report.samples.items() if k[0] == "rms_norm"}
    )
    rows = matrix_of(merge_reports([small_report, rms_only]))
    assert {row.cross_vendor for row in rows if row.op == "silu_and_mul"} == {"-"}
    assert {row.cross_vendor for row in rows if row.op == "rms_norm" and row.combo != "illegal calls"} == {"agree"}


def test_matrix_marks_the_row_of_a_disagreement(small_report: GateReport) -> None:
    merged = merge_reports([node(small_report, "rocm", +0.1), node(small_report, "cuda", -0.1)])
    (flag,) = merged.disagreements
    flagged = [(row.op, row.combo) for row in matrix_of(merged) if row.cross_vendor == "disagree"]
    assert flagged == [(flag.op, flag.combo)]


def test_cases_run_on_different_inputs_are_not_compared(small_report: GateReport) -> None:
    # Calls recorded from each node's own generation: same name and shapes, other data.
    other_inputs = node(small_report, "cuda", -0.1)
    key = next(iter(other_inputs.samples))
    shifted = {"out": SampledOutput("fp32", tuple(v * 3 for v in REFERENCE_VALUES))}
    other_inputs = dataclasses.replace(other_inputs, samples={key: OutputSample(shifted, shifted)})
    merged = merge_reports([node(small_report, "rocm", +0.1), other_inputs])
    assert merged.disagreements == () and key not in merged.compared
