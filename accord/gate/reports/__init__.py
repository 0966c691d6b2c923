"""The gate's reports: report.json (versioned schema, for machines), junit.xml (for CI)
and report.html (one self-contained page, for people), each with the pinned
environment; for one node's run or for several nodes merged."""

from __future__ import annotations

import json
from pathlib import Path

from .document import (
    Check,
    CheckStatus,
    Disagreement,
    GateReport,
    MergedReport,
    RecordedSignature,
    ServedAdapter,
    load_report,
    merged_document,
    report_document,
    validate_document,
)
from .html import render_merged_html, render_report_html
from .junit import render_merged_junit, render_report_junit

REPORT_FILES = ("report.json", "junit.xml", "report.html")


def write_reports(report: GateReport | MergedReport, directory: str | Path) -> list[Path]:
    """Write the three reports into `directory` (created if needed); returns their paths."""
    if isinstance(report, MergedReport):
        document, junit, html = merged_document(report), render_merged_junit(report), render_merged_html(report)
    else:
        document, junit, html = report_document(report), render_report_junit(report), render_report_html(report)
    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    contents = (json.dumps(document, indent=1, allow_nan=False) + "\n", junit, html)
    paths = [directory / name for name in REPORT_FILES]
    for path, content in zip(paths, contents):
        path.write_text(content, encoding="utf-8")
    return paths


__all__ = [
    "Check",
    "CheckStatus",
    "Disagreement",
    "GateReport",
    "MergedReport",
    "REPORT_FILES",
    "RecordedSignature",
    "ServedAdapter",
    "load_report",
    "validate_document",
    "write_reports",
]
