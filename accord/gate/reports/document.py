"""The gate's findings as typed data, and their versioned JSON form (`report.json`).

A GateReport is one node's run: the pinned environment, the op conformance results
(with a few output values per case, so reports of different vendors can be compared
with each other), and the deploy checks. A MergedReport is several of them side by
side with the cases where vendors disagree with each other."""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, field
from enum import Enum
from functools import lru_cache
from pathlib import Path
from typing import Any, Mapping

from ...conformance.results import CaseResult, ConformanceReport, Status

REPORT_SCHEMA = "accord.conformance.report"
MERGED_SCHEMA = "accord.conformance.merged"
#: Bumped on any change a reader of report.json could notice.
SCHEMA_VERSION = 1
SCHEMA_DIR = Path(__file__).with_name("schema")


class CheckStatus(str, Enum):
    """A deploy check's outcome; `skipped` always carries its reason, and `warn` is a
    finding reported without failing the gate (determinism when not required)."""

    PASS = "pass"
    FAIL = "fail"
    WARN = "warn"
    SKIPPED = "skipped"


@dataclass(frozen=True)
class Check:
    """One gate check outside the op matrix (preflight, profile_run, the greedy
    comparison, a server-path check), with the figures it measured."""

    name: str
    group: str
    status: CheckStatus
    message: str = ""
    figures: Mapping[str, float | int | None] = field(default_factory=dict)


@dataclass(frozen=True)
class SampledOutput:
    """Evenly strided values of one output tensor, flattened, as plain floats."""

    dtype: str
    values: tuple[float | None, ...]


@dataclass(frozen=True)
class OutputSample:
    """What one case produced on the backend and on the reference, sampled."""

    backend: Mapping[str, SampledOutput]
    reference: Mapping[str, SampledOutput]


#: A case's identity within a run: (op, dtype combination, case name).
CaseKey = tuple[str, str, str]


@dataclass(frozen=True)
class RecordedSignature:
    """One distinct op signature a rank of the deploy's engine called (profile_run and
    generation), and the conformance case that replays it."""

    rank: int
    op: str
    combo: str
    case: str


@dataclass(frozen=True)
class ServedAdapter:
    """One LoRA adapter the deploy serves and the gate ran (deploy.yaml's
    `lora_modules`): its name and folder, what its adapter_config.json says, and the
    sha256 of its weights file, so a report names exactly the adapter it checked."""

    name: str
    path: str
    base_model_name: str | None
    rank: int
    target_modules: tuple[str, ...]
    weights_sha256: str


@dataclass(frozen=True)
class GateReport:
    """One node's gate run. `conformance` is None when the gate stopped before the
    op checks (a deploy config the backend cannot serve, say)."""

    environment: Mapping[str, Any]
    conformance: ConformanceReport | None
    checks: tuple[Check, ...] = ()
    samples: Mapping[CaseKey, OutputSample] = field(default_factory=dict)
    #: Every rank's recorded op signatures (empty without a deploy config).
    recorded: tuple[RecordedSignature, ...] = ()
    #: The LoRA adapters the deploy serves, each generated under and compared (empty
    #: without `lora_modules`).
    adapters: tuple[ServedAdapter, ...] = ()

    @property
    def ranks(self) -> tuple[int, ...]:
        """The ranks that recorded op signatures, in order."""
        return tuple(sorted({signature.rank for signature in self.recorded}))

    @property
    def backend(self) -> str:
        """The backend this node ran."""
        return str(self.environment["backend"])

    @property
    def passed(self) -> bool:
        """The gate's verdict: no failed case and no failed check."""
        failed_ops = self.conformance is not None and self.conformance.failed
        return not failed_ops and all(check.status is not CheckStatus.FAIL for check in self.checks)

    @property
    def results(self) -> tuple[CaseResult, ...]:
        """Every op case result (none when the gate stopped before the op checks)."""
        return self.conformance.results if self.conformance is not None else ()

    def failures(self) -> list[str]:
        """One line per failed case or check, naming the op or the check."""
        lines = [f"{r.op} [{r.combo}] {r.case}: {r.message}" for r in self.results if r.status is Status.FAIL]
        lines += [f"{c.group}/{c.name}: {c.message}" for c in self.checks if c.status is CheckStatus.FAIL]
        return lines


@dataclass(frozen=True)
class Disagreement:
    """A case where two backends differ from each other by more than either differs
    from the reference (errors as NMSE on the sampled outputs, or mismatch fractions)."""

    op: str
    case: str
    combo: str
    first: str
    second: str
    between: float
    first_vs_reference: float
    second_vs_reference: float


@dataclass(frozen=True)
class MergedReport:
    """Reports of several nodes side by side; `columns` labels each source (its backend,
    with the host added where two sources share a backend); `compared` lists the cases
    at least two nodes ran on the same inputs, which alone can disagree."""

    sources: tuple[GateReport, ...]
    columns: tuple[str, ...]
    disagreements: tuple[Disagreement, ...]
    compared: tuple[CaseKey, ...] = ()

    @property
    def passed(self) -> bool:
        """Every source passed and no two vendors disagree."""
        return all(source.passed for source in self.sources) and not self.disagreements


# -- JSON ------------------------------------------------------------------------------
def _number(value: float | None) -> float | None:
    """JSON has no NaN or Inf: a non-finite figure becomes null (its message says more)."""
    return value if value is None or math.isfinite(value) else None


def _sample_json(sample: Mapping[str, SampledOutput]) -> dict[str, Any]:
    return {name: {"dtype": s.dtype, "values": list(s.values)} for name, s in sample.items()}


def _result_json(result: CaseResult, sample: OutputSample | None) -> dict[str, Any]:
    document = {
        "op": result.op,
        "case": result.case,
        "combo": result.combo,
        "status": result.status.value,
        "message": result.message,
        "error": _number(result.error),
        "tolerance": _number(result.tolerance),
        "deterministic": result.deterministic,
        "batch_invariant": result.batch_invariant,
        "tolerance_note": result.tolerance_note,
        "unit": result.unit,
    }
    if sample is not None:
        document["sample"] = {"backend": _sample_json(sample.backend), "reference": _sample_json(sample.reference)}
    return document


def report_document(report: GateReport) -> dict[str, Any]:
    """The report as report.json holds it."""
    conformance = report.conformance
    return {
        "schema": REPORT_SCHEMA,
        "schema_version": SCHEMA_VERSION,
        "passed": report.passed,
        "environment": dict(report.environment),
        "conformance": None if conformance is None else {
            "backend": conformance.backend,
            "reference": conformance.reference,
            "seed": conformance.seed,
            "seconds": conformance.seconds,
            "counts": {status.value: conformance.counts()[status] for status in Status},
            "results": [_result_json(r, report.samples.get((r.op, r.combo, r.case))) for r in conformance.results],
        },
        "checks": [
            {"name": c.name, "group": c.group, "status": c.status.value, "message": c.message,
             "figures": {k: _number(v) for k, v in c.figures.items()}}
            for c in report.checks
        ],
        "recorded": [{"rank": r.rank, "op": r.op, "combo": r.combo, "case": r.case} for r in report.recorded],
        "lora_adapters": [
            {"name": a.name, "path": a.path, "base_model_name": a.base_model_name, "rank": a.rank,
             "target_modules": list(a.target_modules), "weights_sha256": a.weights_sha256}
            for a in report.adapters
        ],
    }


def merged_document(merged: MergedReport) -> dict[str, Any]:
    """The merged report as its report.json holds it (every source embedded whole)."""
    return {
        "schema": MERGED_SCHEMA,
        "schema_version": SCHEMA_VERSION,
        "passed": merged.passed,
        "columns": list(merged.columns),
        "sources": [report_document(source) for source in merged.sources],
        "compared": [{"op": op, "combo": combo, "case": case} for op, combo, case in merged.compared],
        "disagreements": [
            {"op": d.op, "case": d.case, "combo": d.combo, "first": d.first, "second": d.second,
             "between": d.between, "first_vs_reference": d.first_vs_reference,
             "second_vs_reference": d.second_vs_reference}
            for d in merged.disagreements
        ],
    }


def _sample_from(document: Mapping[str, Any]) -> dict[str, SampledOutput]:
    return {name: SampledOutput(s["dtype"], tuple(s["values"])) for name, s in document.items()}


def report_from_document(document: Mapping[str, Any]) -> GateReport:
    """Read a report.json back (validated against its schema first)."""
    validate_document(document)
    section = document["conformance"]
    conformance, samples = None, {}
    if section is not None:
        results = []
        for entry in section["results"]:
            results.append(CaseResult(
                entry["op"], entry["case"], entry["combo"], Status(entry["status"]), entry["message"],
                entry["error"], entry["tolerance"], entry["deterministic"], entry["batch_invariant"],
                entry["tolerance_note"], unit=entry.get("unit", "nmse"),
            ))
            if "sample" in entry:
                samples[(entry["op"], entry["combo"], entry["case"])] = OutputSample(
                    _sample_from(entry["sample"]["backend"]), _sample_from(entry["sample"]["reference"])
                )
        conformance = ConformanceReport(
            section["backend"], section["reference"], section["seed"], tuple(results), section["seconds"]
        )
    checks = tuple(
        Check(c["name"], c["group"], CheckStatus(c["status"]), c["message"], c["figures"]) for c in document["checks"]
    )
    recorded = tuple(RecordedSignature(r["rank"], r["op"], r["combo"], r["case"]) for r in document.get("recorded", ()))
    adapters = tuple(
        ServedAdapter(a["name"], a["path"], a["base_model_name"], a["rank"], tuple(a["target_modules"]),
                      a["weights_sha256"])
        for a in document.get("lora_adapters", ())
    )
    return GateReport(document["environment"], conformance, checks, samples, recorded, adapters)


def load_report(path: str | Path) -> GateReport:
    """A node's report.json, validated and typed."""
    with Path(path).open() as handle:
        return report_from_document(json.load(handle))


@lru_cache(maxsize=None)
def _schema(name: str) -> dict[str, Any]:
    with (SCHEMA_DIR / name).open() as handle:
        return json.load(handle)


class ReportFormatError(ValueError):
    """A file that is not a report.json of this schema version; says where it breaks."""


def validate_document(document: Mapping[str, Any]) -> None:
    """Raise ReportFormatError unless `document` is a report.json (of one node, or
    merged) of this schema version."""
    import jsonschema  # only readers and tests validate; writing needs no jsonschema

    merged = document.get("schema") == MERGED_SCHEMA
    checks = [(document, "merged.schema.json" if merged else "report.schema.json")]
    if merged:
        checks += [(source, "report.schema.json") for source in document.get("sources", [])]
    for part, schema in checks:
        try:
            jsonschema.validate(part, _schema(schema))
        except jsonschema.ValidationError as error:
            where = "/".join(str(step) for step in error.absolute_path) or "the top level"
            raise ReportFormatError(f"not a valid {schema.split('.')[0]}.json (schema version "
                                    f"{SCHEMA_VERSION}): {error.message} at {where}") from None
