"""The op x dtype-combination matrix the HTML report draws: one row per (op, combo),
one cell per backend column, each classed pass / fail / refused / unsupported."""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass
from typing import Sequence

from ...conformance.results import CaseResult, ConformanceReport, Status
from ...conformance.table import rows as table_rows
from ...conformance.table import verdict

#: Shown where a column's report has no case for the row.
ABSENT = "absent"


@dataclass(frozen=True)
class Cell:
    """One backend's verdict on one (op, combo) group, as the printed table words it."""

    css: str
    verdict: str
    worst: str = "-"
    deterministic: str = "-"
    batch_invariant: str = "-"


@dataclass(frozen=True)
class MatrixRow:
    """An (op, combo) row: a cell per column, and how the columns compare with each
    other: `disagree`, `agree`, or `-` where no two of them ran it on the same inputs."""

    op: str
    combo: str
    cells: tuple[Cell, ...]
    cross_vendor: str = "-"


def cell_class(results: Sequence[CaseResult]) -> str:
    """The colour of a group: a failure wins, then unsupported (never shown as a pass),
    then pass; a group of refused illegal calls is `refused`."""
    counts = Counter(r.status for r in results)
    for status in (Status.FAIL, Status.UNSUPPORTED, Status.SHARED, Status.PASS):
        if counts[status]:
            return status.value
    return Status.REFUSED.value


def _cells(report: ConformanceReport) -> dict[tuple[str, str], Cell]:
    groups: dict[tuple[str, str], list[CaseResult]] = {}
    for result in report.results:
        groups.setdefault((result.op, result.combo), []).append(result)
    printed = {(row[0], row[1]): row for row in table_rows(report)}
    return {
        key: Cell(cell_class(results), verdict(results), *printed[key][4:7])
        for key, results in groups.items()
    }


def build_matrix(
    reports: Sequence[ConformanceReport | None],
    compared: frozenset[tuple[str, str]] = frozenset(),
    disagreeing: frozenset[tuple[str, str]] = frozenset(),
) -> list[MatrixRow]:
    """Rows over every (op, combo) any report has, in first-seen order; a column whose
    report lacks the row (or that has no op results at all) shows `absent`. `compared`
    and `disagreeing` are the (op, combo) rows vendors were compared on and differ on."""
    columns = [_cells(report) if report is not None else {} for report in reports]
    keys = list(dict.fromkeys(key for cells in columns for key in cells))
    rows = []
    for op, combo in keys:
        cells = tuple(column.get((op, combo), Cell(ABSENT, ABSENT)) for column in columns)
        cross = "disagree" if (op, combo) in disagreeing else "agree" if (op, combo) in compared else "-"
        rows.append(MatrixRow(op, combo, cells, cross))
    return rows
