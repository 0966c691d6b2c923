"""The printed conformance matrix: one line per (op, dtype combination) with its
verdict, then the declared tolerance overrides and adapters, the unsupported reasons
and the failures."""

from __future__ import annotations

from collections import Counter

from .results import CaseResult, ConformanceReport, Status

HEADER = ("op", "dtypes", "cases", "result", "worst err / tol", "determ.", "batch-inv.")
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


def _unsupported_notes(report: ConformanceReport) -> list[str]:
    """Per op, how many cases the backend declined and the first reason."""
    by_op: dict[str, list[CaseResult]] = {}
    for result in report.results:
        if result.status is Status.UNSUPPORTED:
            by_op.setdefault(result.op, []).append(result)
    lines = [f"  {op}: {len(results)} cases, e.g. {results[0].message}" for op, results in by_op.items()]
    return _section("unsupported (declared by the backend, not counted as passed):", lines)


def _exception_notes(report: ConformanceReport) -> list[str]:
    """Kernels shared with the reference (nothing was checked), and the ops a backend
    declares nondeterministic or batch-variant that made use of it."""
    shared = dict.fromkeys(r.op for r in report.results if r.status is Status.SHARED)
    declared = dict.fromkeys(f"  {r.op}: {r.message}" for r in report.results
                             if r.status is not Status.FAIL and "declared by the backend" in r.message)
    return [
        *_section("shared with the reference (the reference's own kernel: not an independent pass):",
                  [f"  {op}" for op in shared]),
        *_section("declared exceptions (determinism, batch invariance):", list(declared)),
    ]


def _failure_notes(report: ConformanceReport) -> list[str]:
    failures = [r for r in report.results if r.status is Status.FAIL]
    lines = [f"  {r.op} [{r.combo}] {r.case}: {r.message}" for r in failures[:MAX_FAILURE_LINES]]
    if len(failures) > MAX_FAILURE_LINES:
        lines.append(f"  ... and {len(failures) - MAX_FAILURE_LINES} more failures")
    return _section("failures:", lines)


def render(report: ConformanceReport) -> str:
    """The whole printout: header line, matrix, notes and the summary line."""
    counts = report.counts()
    summary = ", ".join(f"{status.value} {counts[status]}" for status in Status)
    outcome = "FAILED" if report.failed else "OK"
    unsupported = report.unsupported_ops()
    headline = [f"UNSUPPORTED: {counts[Status.UNSUPPORTED]} cases declined, in ops {', '.join(unsupported)} "
                "(not passed; --require-all fails on them)"] if unsupported else []
    lines = [
        f"conformance of backend '{report.backend}' against '{report.reference}' (seed {report.seed})",
        "",
        *_aligned([HEADER, *rows(report)]),
        *_declared_notes(report),
        *_unsupported_notes(report),
        *_exception_notes(report),
        *_failure_notes(report),
        "",
        *headline,
        f"{outcome}: {len(report.results)} cases over {len(report.ops())} ops in {report.seconds:.1f}s ({summary})",
    ]
    return "\n".join(lines)
