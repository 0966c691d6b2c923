"""What conformance found, as plain data: one CaseResult per case and the report of a
run. Printing (table.py) and the machine-readable reports are built from these."""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass
from enum import Enum


class Status(str, Enum):
    """A case's outcome. `refused` is an illegal call refused as its contract declares;
    `unsupported` a legal call the backend declines; `shared` a case that passed with
    the reference's own kernel, which checks nothing (neither counts as passed)."""

    PASS = "pass"
    FAIL = "fail"
    REFUSED = "refused"
    UNSUPPORTED = "unsupported"
    SHARED = "shared"


@dataclass(frozen=True)
class CaseResult:
    """One case on one backend. `error` is the worst value output's error against its
    bound `tolerance`, both in `unit`: NMSE, or ulps of the output dtype for ops rounded
    once (exact outputs, such as ids, report mismatches in `message`);
    `deterministic` and `batch_invariant` are None where they were not checked;
    `tolerance_note` says when the backend declared a wider tolerance, and `adapters`
    which declared boundary casts the dispatcher applied."""

    op: str
    case: str
    combo: str
    status: Status
    message: str = ""
    error: float | None = None
    tolerance: float | None = None
    deterministic: bool | None = None
    batch_invariant: bool | None = None
    tolerance_note: str = ""
    adapters: str = ""
    unit: str = "nmse"


@dataclass(frozen=True)
class ConformanceReport:
    """A run of one backend against the reference: every result, in op order."""

    backend: str
    reference: str
    seed: int
    results: tuple[CaseResult, ...]
    seconds: float

    @property
    def failed(self) -> bool:
        """Whether any case failed (the run's exit status)."""
        return any(r.status is Status.FAIL for r in self.results)

    def unsupported_ops(self) -> list[str]:
        """Ops with at least one case the backend declined, in run order."""
        return list(dict.fromkeys(r.op for r in self.results if r.status is Status.UNSUPPORTED))

    def counts(self) -> Counter[Status]:
        """How many cases ended in each status."""
        return Counter(r.status for r in self.results)

    def ops(self) -> list[str]:
        """The ops this run covered, in run order."""
        return list(dict.fromkeys(r.op for r in self.results))
