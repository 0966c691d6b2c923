"""The cpu backend's bf16 compute path (taken on AVX512-BF16 and AMX hosts), forced on
whatever CPU runs the tests: its kernels still meet their contracts, and the tiny
Mixtral's bf16 logits still match transformers end to end. Without the forcing, a
host without native bf16 (this CI's) would never run that path."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

import accord.backends.cpu as cpu_backend
from accord.backends.cpu import capability
from accord.backends import get_backend
from accord.backends.cpu.kernels._precision import work_dtype
from accord.conformance import ConformanceRunner, Status, cases_for

#: Decides by the CPU's ISA: `.ci/run` reruns it as on each kind of CPU (tests/conftest.py).
pytestmark = pytest.mark.isa

REPO = Path(__file__).resolve().parents[2]
#: The kernels whose arithmetic dtype follows the bf16 path.
BF16_PATH_OPS = ("paged_attention", "mla_attention", "fused_moe", "linear")


@pytest.fixture
def native_bf16(monkeypatch: pytest.MonkeyPatch) -> None:
    """The cpu backend behaves as on a CPU with native bf16 GEMMs."""
    monkeypatch.setattr(capability, "cpu_has_native_bf16", lambda: True)


def test_forcing_puts_the_kernels_on_the_bf16_path(native_bf16: None) -> None:
    assert work_dtype(torch.bfloat16) == torch.bfloat16
    assert get_backend("cpu").compute_dtype(torch.bfloat16) == torch.bfloat16


@pytest.mark.parametrize("op", BF16_PATH_OPS)
def test_the_bf16_path_meets_the_contracts(native_bf16: None, op: str) -> None:
    # bf16 cases only: emulated bf16 GEMMs are slow where the CPU lacks them.
    runner = ConformanceRunner(get_backend("cpu"), get_backend("reference"))
    results = [runner.run_case(case) for case in cases_for(op) if not case.expect_refusal and "bf16" in case.combo]
    assert results
    failures = [f"{r.combo} {r.case}: {r.message}" for r in results if r.status is Status.FAIL]
    assert not failures, failures


@pytest.mark.parametrize(("value", "native"), [("native", True), ("fp32", False)])
def test_the_environment_variable_forces_the_path(monkeypatch: pytest.MonkeyPatch, value: str, native: bool) -> None:
    monkeypatch.setenv(cpu_backend.BF16_PATH_VARIABLE, value)
    cpu_backend.cpu_has_native_bf16.cache_clear()
    try:
        assert cpu_backend.cpu_has_native_bf16() is native
    finally:
        monkeypatch.undo()
        cpu_backend.cpu_has_native_bf16.cache_clear()


def test_a_misspelt_forcing_is_refused(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(cpu_backend.BF16_PATH_VARIABLE, "yes")
    cpu_backend.cpu_has_native_bf16.cache_clear()
    try:
        with pytest.raises(ValueError, match="native, fp32 or auto"):
            cpu_backend.cpu_has_native_bf16()
    finally:
        monkeypatch.undo()
        cpu_backend.cpu_has_native_bf16.cache_clear()


@pytest.mark.slow
def test_mixtral_bf16_logits_match_transformers_on_the_bf16_path() -> None:
    # The failure seen on AVX512-BF16 hosts (relative max logit difference 0.41 against
    # the 0.05 bound), reproduced here by forcing the path in a fresh process.
    test = "tests/models/test_models_parity.py::test_bf16_prompt_logits_match_transformers_within_bf16_bound[mixtral-cpu]"
    env = {**os.environ, cpu_backend.BF16_PATH_VARIABLE: "native"}
    result = subprocess.run([sys.executable, "-m", "pytest", "-q", "-n", "0", "-p", "no:cacheprovider", test],
                            cwd=REPO, env=env, capture_output=True, text=True)
    assert result.returncode == 0, result.stdout[-3000:]
