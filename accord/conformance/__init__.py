"""Conformance: seeded cases for every op contract, run on a backend and judged
against the reference backend (llama.cpp's test-backend-ops, made stricter)."""

from .case import Case
from .cases import GENERATORS, cases_for
from .results import CaseResult, ConformanceReport, Status
from .runner import ConformanceRunner

__all__ = ["Case", "CaseResult", "ConformanceReport", "ConformanceRunner", "GENERATORS", "Status", "cases_for"]
