"""The printout: the outcome first (the verdict, every failure and the per-op status
counts come before the matrix), then one matrix row per (op, dtype combination), where
failures win, unsupported is never shown as passed, and declared overrides are printed,
not hidden. The declared exceptions (the batch-variant rows a backend declares) are one
line per op unless --verbose asks for one per case. The later tests run real
conformance on the deliberately broken doubles, judged by the reference."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
from conformance_doubles import broken, rms_norm_depending_on_batch_size, rms_norm_writing_half_the_columns

from accord.backends import Backend, get_backend
from accord.cli.commands import conformance as command
from accord.cli.main import main
from accord.conformance import CaseResult, ConformanceReport, ConformanceRunner, Status
from accord.conformance.table import HEADER, render, verdict

#: The ops the runs on broken doubles check.
OPS = ["rms_norm", "silu_and_mul"]


def result(status: Status, combo: str = "x=fp32", **fields: object) -> CaseResult:
    return CaseResult("rms_norm", "T=1", combo, status, **fields)  # type: ignore[arg-type]


def report(*results: CaseResult) -> ConformanceReport:
    return ConformanceReport("cpu", "reference", 0, results, 1.0)


def matrix_start(lines: list[str]) -> int:
    """The index of the matrix's header line."""
    return next(i for i, line in enumerate(lines) if line.split()[:2] == list(HEADER[:2]))


def test_one_failure_fails_the_group() -> None:
    assert verdict([result(Status.PASS), result(Status.FAIL), result(Status.UNSUPPORTED)]) == "FAIL 1/3"


def test_unsupported_cases_are_counted_apart_from_passes() -> None:
    assert verdict([result(Status.PASS), result(Status.UNSUPPORTED)]) == "pass 1, unsupported 1"
    assert verdict([result(Status.UNSUPPORTED)]) == "unsupported"


def test_cases_of_one_combination_share_a_row_wherever_they_ran() -> None:
    lines = render(report(result(Status.PASS), result(Status.PASS, "x=bf16"), result(Status.PASS))).splitlines()
    matrix = lines[matrix_start(lines):]
    rows = [line for line in matrix if line.startswith("rms_norm")]
    assert [row.split()[1:3] for row in rows] == [["x=fp32", "2"], ["x=bf16", "1"]]


def test_tolerance_overrides_are_printed() -> None:
    note = "tolerance 1e-09 -> 0.0001 declared by backend: interpreter rounding"
    text = render(report(result(Status.PASS, error=1e-6, tolerance=1e-4, tolerance_note=note)))
    assert f"rms_norm: {note}" in text


def test_summary_line_says_failed_when_anything_failed() -> None:
    text = render(report(result(Status.PASS), result(Status.FAIL, message="out: NMSE 1 > 1e-09")))
    assert "rms_norm [x=fp32] T=1: out: NMSE 1 > 1e-09" in text
    assert text.splitlines()[-1].startswith("FAILED: 2 cases over 1 ops")


def test_unsupported_cases_are_summarised_per_op_with_a_reason() -> None:
    declined = [result(Status.UNSUPPORTED, message=f"x is fp{n} but the kernel claims bf16 only") for n in (16, 32)]
    text = render(report(*declined))
    assert "  rms_norm: 2 cases, e.g. x is fp16 but the kernel claims bf16 only" in text
    assert text.splitlines()[-1].startswith("OK:")


def test_applied_adapters_are_printed() -> None:
    text = render(report(result(Status.PASS, adapters="cast token_ids int64->int32")))
    assert "  rms_norm: cast token_ids int64->int32" in text


def run(backend: Backend) -> ConformanceReport:
    """rms_norm and silu_and_mul of `backend` against the reference."""
    return ConformanceRunner(backend, get_backend("reference")).run(OPS)


@pytest.fixture(scope="module")
def half_writer_report() -> ConformanceReport:
    """A backend whose rms_norm leaves half its output unwritten (silu_and_mul is sound)."""
    return run(broken("half-writer", "rms_norm", rms_norm_writing_half_the_columns))


@pytest.fixture(scope="module")
def batchy_report() -> ConformanceReport:
    """A backend whose rms_norm depends on the batch size, and declares it."""
    return run(broken("batchy", "rms_norm", rms_norm_depending_on_batch_size, "batch_variant"))


def test_the_verdict_is_the_line_after_the_title(half_writer_report: ConformanceReport) -> None:
    lines = render(half_writer_report).splitlines()
    assert lines[1].startswith(f"FAILED: {len(half_writer_report.results)} cases over 2 ops")


def test_each_failure_is_named_before_the_matrix(half_writer_report: ConformanceReport) -> None:
    lines = render(half_writer_report).splitlines()
    failures = [r for r in half_writer_report.results if r.status is Status.FAIL]
    assert failures and {r.op for r in failures} == {"rms_norm"}
    summary = lines[:matrix_start(lines)]
    for failure in failures:
        named = [line for line in summary if line == f"  rms_norm [{failure.combo}] {failure.case}: {failure.message}"]
        assert len(named) == 1
    assert all("never written" in failure.message for failure in failures)


def test_the_summary_counts_each_ops_cases_by_status(half_writer_report: ConformanceReport) -> None:
    lines = render(half_writer_report).splitlines()
    header = next(i for i, line in enumerate(lines) if line.split() == ["op", "cases", *(s.value for s in Status)])
    assert header < matrix_start(lines)
    counts = {line.split()[0]: line.split()[1:] for line in lines[header + 1:header + 1 + len(OPS)]}
    for op in OPS:
        results = [r for r in half_writer_report.results if r.op == op]
        expected = [str(len(results)), *(str(sum(r.status is s for r in results)) for s in Status)]
        assert counts[op] == expected
    # rms_norm: its legal cases fail and its illegal ones are refused; silu_and_mul has no failure.
    assert counts["rms_norm"][2] != "0" and counts["rms_norm"][3] != "0" and counts["silu_and_mul"][2] == "0"


def test_the_verdict_also_closes_the_printout(half_writer_report: ConformanceReport) -> None:
    lines = render(half_writer_report).splitlines()
    assert lines[-1] == lines[1]


def test_declared_batch_variance_is_one_line_per_op(batchy_report: ConformanceReport) -> None:
    variant = [r for r in batchy_report.results if r.batch_invariant is False]
    checked = [r for r in batchy_report.results if r.batch_invariant is not None and r.op == "rms_norm"]
    assert len(variant) > 1 and not batchy_report.failed
    notes = [line for line in render(batchy_report).splitlines() if "batch-variant (declared by the backend)" in line]
    assert notes == [f"  rms_norm: batch-variant (declared by the backend) in {len(variant)} of {len(checked)} cases "
                     "(--verbose names each case's rows)"]


def test_verbose_prints_each_cases_batch_variant_rows(batchy_report: ConformanceReport) -> None:
    variant = [r for r in batchy_report.results if r.batch_invariant is False]
    lines = render(batchy_report, verbose=True).splitlines()
    notes = [line for line in lines if "batch-variant (declared by the backend)" in line]
    assert notes == [f"  rms_norm [{r.combo}] {r.case}: {r.message}" for r in variant]
    assert all("row 0" in note for note in notes)


def test_the_verbose_flag_reaches_the_printout(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    batchy = broken("batchy", "rms_norm", rms_norm_depending_on_batch_size, "batch_variant")
    backends = {"batchy": batchy, "reference": get_backend("reference")}
    monkeypatch.setattr(command, "default_registry", lambda: SimpleNamespace(get=backends.__getitem__))
    counts = {}
    for flags in ([], ["--verbose"]):
        assert main(["conformance", "--backend", "batchy", "--op", "rms_norm", *flags]) == 0
        counts[bool(flags)] = capsys.readouterr().out.count("batch-variant (declared by the backend)")
    assert counts[False] == 1 and counts[True] > 1
