"""Fixtures for the rollout gate's tests: a tiny random model (dense, and MoE for the
parallel layouts), and one small op conformance run (cpu against the reference) turned
into a gate report. The MoE model comes from the model tests' tiny transformers
checkpoints with the engine tests' tokenizer, and LoRA adapters are made as the LoRA
tests make them; their folders go on sys.path here (and spawned ranks inherit it)."""

from __future__ import annotations

import sys
from pathlib import Path

TESTS = Path(__file__).resolve().parent.parent
for directory in ("models", "engine", "lora"):
    if str(TESTS / directory) not in sys.path:
        sys.path.insert(0, str(TESTS / directory))

import pytest
from gate_helpers import SMALL_OPS, write_tiny_model, write_tiny_moe_model

from accord.backends import get_backend
from accord.conformance import ConformanceRunner
from accord.gate.gate_command import op_gate_report
from accord.gate.reports import GateReport


@pytest.fixture(scope="session")
def tiny_model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A tiny random Llama model directory, written once per session."""
    return write_tiny_model(tmp_path_factory.mktemp("gate-model") / "tiny-llama")


@pytest.fixture(scope="session")
def tiny_moe_model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A tiny random Mixtral (4 experts, top-2) directory, written once per session."""
    return write_tiny_moe_model(tmp_path_factory.mktemp("gate-moe-model") / "tiny-mixtral")


@pytest.fixture(scope="session")
def small_report() -> GateReport:
    """rms_norm and silu_and_mul on the cpu backend, judged against the reference."""
    cpu, reference = get_backend("cpu"), get_backend("reference")
    return op_gate_report(ConformanceRunner(cpu, reference).run(SMALL_OPS), cpu, reference)
