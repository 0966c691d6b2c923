"""`accord conformance merge`: several nodes' report.json side by side as one
cross-vendor matrix (backend x op x signature), flagging cases where two vendors
differ from each other by more than either differs from the reference."""

from __future__ import annotations

import itertools
from collections import Counter
from pathlib import Path
from typing import Iterable, Sequence

import torch

from ..conformance.compare import NMSE, ULPS, ulp_distance
from ..op_contracts import dtype_named
from .reports import Disagreement, GateReport, MergedReport, load_report
from .reports.document import CaseKey, OutputSample, SampledOutput

#: Two vendors' difference is flagged only beyond this many of the case's tolerances.
#: Independent rounding noise makes two vendors differ from each other by about the sum
#: of their own errors, which is more than either's; what matters is two vendors, each
#: within tolerance of the reference, that are out of tolerance of each other.
TOLERANCES_APART = 1.0
#: Two nodes ran a case on the same inputs when their references agree this closely
#: (in tolerances; exactly for exact outputs): the reference may round differently
#: on different hosts, never by a sizeable part of a tolerance.
SAME_INPUTS = 1e-3


class MergeError(ValueError):
    """Reports that cannot be compared (different seeds or reference backends)."""


def merge_files(paths: Iterable[str | Path]) -> MergedReport:
    """Load and merge report.json files (each validated against its schema)."""
    return merge_reports([load_report(path) for path in paths])


def merge_reports(reports: Sequence[GateReport]) -> MergedReport:
    """Merge reports of different nodes; their cases must come from the same seed and
    be judged against the same reference backend, or they are not the same cases."""
    if not reports:
        raise MergeError("nothing to merge: give at least one report.json")
    ran = [r.conformance for r in reports if r.conformance is not None]
    if len({(c.seed, c.reference) for c in ran}) > 1:
        found = ", ".join(sorted({f"seed {c.seed} vs '{c.reference}'" for c in ran}))
        raise MergeError(f"reports use different seeds or references ({found}); rerun with one --seed and --reference")
    columns = column_labels(reports)
    compared, disagreements = compare_nodes(reports, columns)
    return MergedReport(tuple(reports), columns, disagreements, compared)


def column_labels(reports: Sequence[GateReport]) -> tuple[str, ...]:
    """Each report's backend, with its host added where two reports share a backend
    (and a counter if they share the host too)."""
    shared = {name for name, count in Counter(r.backend for r in reports).items() if count > 1}
    labels = [
        f"{r.backend}@{r.environment.get('hostname', '?')}" if r.backend in shared else r.backend for r in reports
    ]
    repeated = {label for label, count in Counter(labels).items() if count > 1}
    return tuple(f"{label}#{index}" if label in repeated else label for index, label in enumerate(labels, 1))


def compare_nodes(
    reports: Sequence[GateReport], columns: Sequence[str]
) -> tuple[tuple[CaseKey, ...], tuple[Disagreement, ...]]:
    """The cases compared between at least two nodes, and every (case, pair of nodes)
    where the two differ from each other by more than either differs from the
    reference and by more than the case's tolerance. A case is compared only where
    both nodes' references agree, i.e. both ran it on the same inputs (calls recorded
    from each node's own generation usually did not)."""
    compared: set[CaseKey] = set()
    found = []
    for (first, a), (second, b) in itertools.combinations(zip(columns, reports), 2):
        rules = {(r.op, r.combo, r.case): (r.tolerance or 0.0, r.unit) for r in (*a.results, *b.results)}
        for key in sorted(a.samples.keys() & b.samples.keys()):
            tolerance, unit = rules.get(key, (0.0, NMSE))
            figures = _pair_figures(a.samples[key], b.samples[key], tolerance, unit)
            if figures is None:
                continue
            compared.add(key)
            between, first_error, second_error = figures
            if between > max(first_error, second_error) and between > TOLERANCES_APART * tolerance:
                op, combo, case = key
                found.append(Disagreement(op, case, combo, first, second, between, first_error, second_error))
    found.sort(key=lambda d: (d.op, d.combo, d.case, d.first, d.second))
    return tuple(sorted(compared)), tuple(found)


def _pair_figures(
    a: OutputSample, b: OutputSample, tolerance: float, unit: str = NMSE
) -> tuple[float, float, float] | None:
    """(a vs b, a vs reference, b vs reference), each the worst over the outputs both
    sampled, in the case's unit; None when there are none or the two references differ
    (other inputs)."""
    names = sorted(a.backend.keys() & b.backend.keys() & a.reference.keys() & b.reference.keys())
    if not names or any(
        distance(a.reference[n], b.reference[n], a.reference[n], unit) > SAME_INPUTS * tolerance for n in names
    ):
        return None
    figures = [
        (distance(a.backend[n], b.backend[n], a.reference[n], unit),
         distance(a.backend[n], a.reference[n], a.reference[n], unit),
         distance(b.backend[n], b.reference[n], b.reference[n], unit))
        for n in names
    ]
    return tuple(max(column) for column in zip(*figures))  # type: ignore[return-value]


def distance(x: SampledOutput, y: SampledOutput, reference: SampledOutput, unit: str = NMSE) -> float:
    """How far two sampled outputs are apart: the fraction of differing elements for
    integer outputs (indices are exact), else the squared difference normalised by the
    reference's energy (NMSE), or the largest difference in ulps of the output dtype
    (at the reference's values, never finer than fp32's at its largest sampled value)
    for a case judged in ulps. Positions where any side is non-finite are left out:
    each node's own result already fails on NaN and Inf mismatches."""
    rows = [
        (u, v, r) for u, v, r in zip(x.values, y.values, reference.values)
        if u is not None and v is not None and r is not None
    ]
    if not rows:
        return 0.0
    u, v, r = torch.tensor(rows, dtype=torch.float64).unbind(1)
    if x.dtype.startswith(("int", "uint", "bool")):
        return float((u != v).double().mean())
    if unit == ULPS:
        return ulp_distance(u, v, r, dtype_named(x.dtype))
    scale = float((r**2).sum())
    error = float(((u - v) ** 2).sum())
    return error / scale if scale > 0 else error
