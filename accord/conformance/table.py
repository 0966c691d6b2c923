"""The printed conformance report. The summary comes first, so a terminal or a CI log
shows the outcome before anything else: the verdict, each failure, the unsupported
reasons, and per op the count of cases in each status. Then the matrix, one line per
(op, dtype combination), the declared tolerance overrides and adapters, and the
declared determinism and batch-invariance exceptions: one line per op, or one per
case when verbose. The verdict closes the printout too, where a terminal's last
screen shows it."""

from __future__ import annotations

from collections import Counter

from .results import CaseResult, ConformanceReport, Status

HEADER = ("op", "dtypes", "cases", "result", "worst err / tol", "determ.", "batch-inv.")
#: The per-op summary's columns: the case count, then one per status.
SUMMARY_HEADER = ("op", "cases", *(status.value for status in Status))
#: How each status other than a failure reads in the result column.
LABELS = {
    Status.PASS: "pass",
    Status.REFUSED: "refused as declared",
    Status.UNSUPPORTED: "unsupported",
    Status.SHARED: "shared with reference",
}
#: Failure lines printed before the rest are summarised as a count.
MAX_FAILURE_LINES = 30


def verdict(results: list[CaseResult]) -> str:
    """One cell for a group of cases: a failure wins, unsupported is never a pass."""
    counts = Counter(r.status for r in results)
    if counts[Status.FAIL]:
        return f"FAIL {counts[Status.FAIL]}/{len(results)}"
    present = [status for status in LABELS if counts[status]]
    if len(present) == 1:
        return LABELS[present[0]]
    return ", ".join(f"{LABELS[status]} {counts[status]}" for status in present)


def _excess(result: CaseResult) -> float:
    """How far a result's error goes toward its bound (error / tolerance)."""
    if result.tolerance:
        return result.error / result.tolerance
    return float("inf") if result.error else 0.0


def _worst(results: list[CaseResult]) -> str:
    measured = [r for r in results if r.error is not None and r.tolerance is not None]
    if not measured:
        return "-"
    worst = max(measured, key=_excess)
    return f"{worst.error:.2g} / {worst.tolerance:.2g}" + (" ulps" if worst.unit == "ulps" else "")


def _flag(values: list[bool | None]) -> str:
    checked = [v for v in values if v is not None]
    if not checked:
        return "-"
    return "yes" if all(checked) else f"no ({checked.count(False)})"


def rows(report: ConformanceReport) -> list[tuple[str, ...]]:
    """The matrix's rows, in run order: op, dtype combination, and the group's cells."""
    groups: dict[tuple[str, str], list[CaseResult]] = {}
    for result in report.results:
        groups.setdefault((result.op, result.combo), []).append(result)
    table = []
    for (op, combo), results in groups.items():
        table.append((
            op,
            combo,
            str(len(results)),
            verdict(results),
            _worst(results),
            _flag([r.deterministic for r in results]),
            _flag([r.batch_invariant for r in results]),
        ))
    return table


def _aligned(lines: list[tuple[str, ...]]) -> list[str]:
    widths = [max(len(line[i]) for line in lines) for i in range(len(lines[0]))]
    return ["  ".join(cell.ljust(width) for cell, width in zip(line, widths)).rstrip() for line in lines]


def _section(title: str, lines: list[str]) -> list[str]:
    return ["", title, *lines] if lines else []


def _declared_notes(report: ConformanceReport) -> list[str]:
    """Tolerance overrides and boundary adapters: declared by the backend, so printed."""
    overrides = dict.fromkeys(f"  {r.op}: {r.tolerance_note}" for r in report.results if r.tolerance_note)
    adapters = dict.fromkeys(f"  {r.op}: {r.adapters}" for r in report.results if r.adapters)
    return [
        *_section("tolerance overrides (declared by the backend):", list(overrides)),
        *_section("boundary adapters applied (declared by the backend):", list(adapters)),
    ]


def _by_op(results: list[CaseResult]) -> dict[str, list[CaseResult]]:
    """`results` grouped by op, in run order."""
    groups: dict[str, list[CaseResult]] = {}
    for result in results:
        groups.setdefault(result.op, []).append(result)
    return groups


def _unsupported_notes(report: ConformanceReport) -> list[str]:
    """Per op, how many cases the backend declined and the first reason."""
    declined = _by_op([r for r in report.results if r.status is Status.UNSUPPORTED])
    lines = [f"  {op}: {len(results)} cases, e.g. {results[0].message}" for op, results in declined.items()]
    return _section("unsupported (declared by the backend, not counted as passed):", lines)


def _declared_exceptions(results: list[CaseResult]) -> str:
    """How many of an op's cases made use of a declared exception, or "" when none did."""
    notes = []
    for name, flags in (("nondeterministic", [r.deterministic for r in results]),
                        ("batch-variant", [r.batch_invariant for r in results])):
        if False in flags:
            checked = sum(flag is not None for flag in flags)
            notes.append(f"{name} (declared by the backend) in {flags.count(False)} of {checked} cases")
    return "; ".join(notes)


def _exception_notes(report: ConformanceReport, verbose: bool) -> list[str]:
    """Kernels shared with the reference (nothing was checked), and the ops a backend
    declares nondeterministic or batch-variant that made use of it: one line per op
    (how many cases), or with `verbose` one per case naming its rows."""
    shared = dict.fromkeys(r.op for r in report.results if r.status is Status.SHARED)
    passed = [r for r in report.results if r.status is not Status.FAIL]
    if verbose:
        declared = [f"  {r.op} [{r.combo}] {r.case}: {r.message}" for r in passed
                    if r.deterministic is False or r.batch_invariant is False]
    else:
        folded = {op: _declared_exceptions(results) for op, results in _by_op(passed).items()}
        declared = [f"  {op}: {notes} (--verbose names each case's rows)" for op, notes in folded.items() if notes]
    return [
        *_section("shared with the reference (the reference's own kernel: not an independent pass):",
                  [f"  {op}" for op in shared]),
        *_section("declared exceptions (determinism, batch invariance):", declared),
    ]


def _failure_notes(report: ConformanceReport) -> list[str]:
    failures = [r for r in report.results if r.status is Status.FAIL]
    lines = [f"  {r.op} [{r.combo}] {r.case}: {r.message}" for r in failures[:MAX_FAILURE_LINES]]
    if len(failures) > MAX_FAILURE_LINES:
        lines.append(f"  ... and {len(failures) - MAX_FAILURE_LINES} more failures")
    return _section("failures:", lines)


def _op_counts(report: ConformanceReport) -> list[str]:
    """Per op, how many cases ended in each status."""
    lines = [SUMMARY_HEADER]
    for op, results in _by_op(list(report.results)).items():
        counts = Counter(r.status for r in results)
        lines.append((op, str(len(results)), *(str(counts[status]) for status in Status)))
    return _aligned(lines)


def verdict_line(report: ConformanceReport) -> str:
    """`OK:` or `FAILED:`, with the case count per status."""
    counts = report.counts()
    tally = ", ".join(f"{status.value} {counts[status]}" for status in Status)
    outcome = "FAILED" if report.failed else "OK"
    return f"{outcome}: {len(report.results)} cases over {len(report.ops())} ops in {report.seconds:.1f}s ({tally})"


def summary(report: ConformanceReport) -> list[str]:
    """What the run found, before the matrix: the verdict, the unsupported headline,
    each failure, the unsupported reasons and the per-op status counts."""
    counts = report.counts()
    unsupported = report.unsupported_ops()
    headline = [f"UNSUPPORTED: {counts[Status.UNSUPPORTED]} cases declined, in ops {', '.join(unsupported)} "
                "(not passed; --require-all fails on them)"] if unsupported else []
    return [
        verdict_line(report),
        *headline,
        *_failure_notes(report),
        *_unsupported_notes(report),
        "",
        *_op_counts(report),
    ]


def render(report: ConformanceReport, verbose: bool = False) -> str:
    """The whole printout: header line, summary, matrix, notes, and the verdict again.
    `verbose` lists each case's declared exceptions instead of one line per op."""
    lines = [
        f"conformance of backend '{report.backend}' against '{report.reference}' (seed {report.seed})",
        *summary(report),
        "",
        *_aligned([HEADER, *rows(report)]),
        *_declared_notes(report),
        *_exception_notes(report, verbose),
        "",
        verdict_line(report),
    ]
    return "\n".join(lines)
