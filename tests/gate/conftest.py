"""Fixtures for the rollout gate's tests: a tiny random model, and one small op
conformance run (cpu against the reference) turned into a gate report."""

from __future__ import annotations

from pathlib import Path

import pytest
from gate_helpers import SMALL_OPS, write_tiny_model

from accord.backends import get_backend
from accord.conformance import ConformanceRunner
from accord.gate.gate_command import op_gate_report
from accord.gate.reports import GateReport


@pytest.fixture(scope="session")
def tiny_model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A tiny random Llama model directory, written once per session."""
    return write_tiny_model(tmp_path_factory.mktemp("gate-model") / "tiny-llama")


@pytest.fixture(scope="session")
def small_report() -> GateReport:
    """rms_norm and silu_and_mul on the cpu backend, judged against the reference."""
    cpu, reference = get_backend("cpu"), get_backend("reference")
    return op_gate_report(ConformanceRunner(cpu, reference).run(SMALL_OPS), cpu, reference)
