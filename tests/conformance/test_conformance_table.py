"""The printed matrix: one row per (op, dtype combination), failures win, unsupported
is never shown as passed, and declared overrides are printed, not hidden."""

from __future__ import annotations

from accord.conformance import CaseResult, ConformanceReport, Status
from accord.conformance.table import render, verdict


def result(status: Status, combo: str = "x=fp32", **fields: object) -> CaseResult:
    return CaseResult("rms_norm", "T=1", combo, status, **fields)  # type: ignore[arg-type]


def report(*results: CaseResult) -> ConformanceReport:
    return ConformanceReport("cpu", "reference", 0, results, 1.0)


def test_one_failure_fails_the_group() -> None:
    assert verdict([result(Status.PASS), result(Status.FAIL), result(Status.UNSUPPORTED)]) == "FAIL 1/3"


def test_unsupported_cases_are_counted_apart_from_passes() -> None:
    assert verdict([result(Status.PASS), result(Status.UNSUPPORTED)]) == "pass 1, unsupported 1"
    assert verdict([result(Status.UNSUPPORTED)]) == "unsupported"


def test_cases_of_one_combination_share_a_row_wherever_they_ran() -> None:
    text = render(report(result(Status.PASS), result(Status.PASS, "x=bf16"), result(Status.PASS)))
    rows = [line for line in text.splitlines() if line.startswith("rms_norm")]
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
