"""report.html: one self-contained page (inline CSS, no scripts, no external files) with
the op x dtype matrix coloured by verdict, error figures, the deploy and smoke checks,
and each node's pinned environment."""

from __future__ import annotations

import json
from collections import Counter
from dataclasses import dataclass
from typing import Any, Mapping

import jinja2

from .document import Check, GateReport, MergedReport, RecordedSignature, ServedAdapter
from .matrix import build_matrix

_TEMPLATES = jinja2.Environment(
    loader=jinja2.PackageLoader("accord.gate.reports", "templates"),
    autoescape=True,
    undefined=jinja2.StrictUndefined,
)


def _figure(value: object) -> str:
    """Four significant digits for measured floats; anything else as it is."""
    return f"{value:.4g}" if isinstance(value, float) else str(value)


_TEMPLATES.filters["figure"] = _figure


@dataclass(frozen=True)
class SourceSection:
    """One node's part of the page: failures, checks, pinned environment, recorded
    signatures and served adapters."""

    label: str
    summary: str
    failures: list[str]
    checks: tuple[Check, ...]
    environment: list[tuple[str, str]]
    #: The op signatures each rank recorded (rank, op, dtypes, replaying case).
    recorded: tuple[RecordedSignature, ...] = ()
    #: The LoRA adapters the node served and checked.
    adapters: tuple[ServedAdapter, ...] = ()


def _environment_rows(environment: Mapping[str, Any]) -> list[tuple[str, str]]:
    """Scalars as they are; nested values (libraries, the deploy config) as JSON."""
    return [
        (key, value if isinstance(value, str) else json.dumps(value, sort_keys=True))
        for key, value in environment.items()
    ]


def _summary(report: GateReport) -> str:
    """`412 cases over 7 ops (pass 380, fail 0, ...), 10 checks (pass 10)`."""
    parts = []
    if report.conformance is not None:
        counts = report.conformance.counts()
        tally = ", ".join(f"{status.value} {counts[status]}" for status in counts)
        parts.append(f"{len(report.results)} cases over {len(report.conformance.ops())} ops ({tally})")
    if report.checks:
        checks = Counter(check.status.value for check in report.checks)
        parts.append(f"{len(report.checks)} checks ({', '.join(f'{k} {v}' for k, v in checks.items())})")
    return "; ".join(parts) or "nothing ran"


def _section(label: str, report: GateReport) -> SourceSection:
    environment = _environment_rows(report.environment)
    return SourceSection(label, _summary(report), report.failures(), report.checks, environment, report.recorded,
                         report.adapters)


def render_report_html(report: GateReport) -> str:
    """The page for one node's gate run."""
    return _TEMPLATES.get_template("report.html.j2").render(
        title=f"accord conformance gate: backend {report.backend}",
        passed=report.passed,
        cross=False,
        columns=[report.backend],
        rows=build_matrix([report.conformance]),
        disagreements=[],
        sources=[_section(f"Node {report.backend}", report)],
    )


def render_merged_html(merged: MergedReport) -> str:
    """The cross-vendor page: one column group per node, the disagreement column and
    list, then every node's checks and environment."""
    compared = frozenset((op, combo) for op, combo, _case in merged.compared)
    disagreeing = frozenset((d.op, d.combo) for d in merged.disagreements)
    return _TEMPLATES.get_template("report.html.j2").render(
        title=f"accord cross-vendor conformance: {', '.join(merged.columns)}",
        passed=merged.passed,
        cross=True,
        columns=list(merged.columns),
        rows=build_matrix([source.conformance for source in merged.sources], compared, disagreeing),
        disagreements=list(merged.disagreements),
        sources=[_section(f"Node {label}", source) for label, source in zip(merged.columns, merged.sources)],
    )
