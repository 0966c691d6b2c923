"""Emulated conformance: the ascend backend's glue (layouts, adapters, dtype claims,
output handling) against the reference backend, every kernel calling the operator
emulator, which refuses what the NPU operators' documentation refuses."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from accord.backends.reference import ReferenceBackend
from accord.conformance import ConformanceRunner
from accord.conformance.results import ConformanceReport, Status
from accord.op_contracts import CONTRACTS

#: Contracts that exist only in fp8, which torch-npu documents for no Ascend generation
#: it supports (npu_dynamic_quant / npu_quant_matmul take int8/int4 on Atlas A2/A3).
FP8_ONLY = {"quantize_fp8", "scaled_mm"}
#: Ops the backend serves with the reference kernel (no NPU operator is wired for them
#: yet, e.g. npu_weight_quant_batchmatmul): conformance reports them shared, never passed.
SHARED_WITH_REFERENCE = {"quant_linear", "quant_embedding", "group_quant_linear"}
#: What every other unsupported case must be refused for: a documented operator limit.
DECLARED_LIMITS = (
    "but the kernel claims",  # a dtype outside the operator's documented set
    "no NPU gating operator computes it",  # grouped sqrt-softplus routing
)


@pytest.fixture(scope="module")
def report(emulated) -> ConformanceReport:
    return ConformanceRunner(emulated, ReferenceBackend()).run()


@pytest.mark.slow
def test_emulated_conformance_has_no_failure(report):
    failures = [f"{r.op} [{r.combo}] {r.case}: {r.message}" for r in report.results if r.status is Status.FAIL]
    assert not failures, "\n".join(failures)


@pytest.mark.slow
def test_every_op_that_torch_npu_can_run_passes_cases(report):
    passed = {r.op for r in report.results if r.status is Status.PASS}
    shared = {r.op for r in report.results if r.status is Status.SHARED}
    assert passed == set(CONTRACTS) - FP8_ONLY - SHARED_WITH_REFERENCE
    assert shared == SHARED_WITH_REFERENCE


def test_unsupported_cases_name_a_documented_limit(report):
    for result in report.results:
        if result.status is not Status.UNSUPPORTED:
            continue
        if result.op in FP8_ONLY:
            assert "torch-npu documents no fp8" in result.message
        else:
            assert any(limit in result.message for limit in DECLARED_LIMITS), result.message


def test_int64_indices_reach_the_kernels_through_declared_adapters(report):
    adapted = {(r.op, r.adapters) for r in report.results if r.status is Status.PASS and r.adapters}
    assert ("paged_attention", "cast block_tables int64->int32") in adapted
    assert ("fused_moe", "cast topk_ids int64->int32") in adapted


@pytest.mark.slow
def test_conformance_command_runs_the_emulated_backend():
    env = {**os.environ, "ACCORD_NPU_EMULATE": "1"}
    result = subprocess.run(
        [sys.executable, "-m", "accord", "conformance", "--backend", "ascend", "--op", "rms_norm",
         "--op", "paged_attention"],
        capture_output=True, text=True, env=env, timeout=300,
    )
    assert result.returncode == 0, result.stdout + result.stderr
    assert "conformance of backend 'ascend'" in result.stdout and "fail 0" in result.stdout
