"""report.html rendered by a real browser: headless Chromium loads the page and its
DOM shows the op matrix, one row per op and dtype combination, with the verdict
colours as classes."""

from __future__ import annotations

from pathlib import Path

from gate_browser import needs_chromium, rendered_matrix

from accord.gate.reports import GateReport, write_reports

pytestmark = needs_chromium


def test_chromium_renders_the_op_matrix(small_report: GateReport, tmp_path: Path) -> None:
    page = write_reports(small_report, tmp_path / "reports")[2]
    reader = rendered_matrix(page, tmp_path / "profile")
    combos = list(dict.fromkeys((r.op, r.combo) for r in small_report.results))
    assert reader.rows == [op for op, _combo in combos]
    assert reader.cell_classes.count("pass") + reader.cell_classes.count("refused") == len(combos)
