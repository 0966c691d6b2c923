"""Conformance checks `linear` on the weight form the backend runs on: the cpu
backend's prepacked weights and bf16 copies pass, and a bf16 weight-streaming shortcut
that loses fp32 numerics fails exactly the cases it breaks."""

from __future__ import annotations

import pytest
from conformance_doubles import Bf16CopyReference

from accord.backends import Backend, get_backend
from accord.backends.cpu.kernels.linear import BF16_COPY, streams_bf16_weights
from accord.conformance import CaseResult, ConformanceRunner, Status


#: The cases' row counts a few-rows path (up to 4 rows) takes.
FEW_ROWS = ("T=1 ", "T=3 ", "T=4 ")


def run_linear(backend: Backend) -> list[CaseResult]:
    return [r for r in ConformanceRunner(backend, get_backend("reference")).run_op("linear") if r.combo != "illegal calls"]


def failed(results: list[CaseResult]) -> set[str]:
    return {r.case for r in results if r.status is Status.FAIL}


def test_cases_cover_one_and_several_rows_on_prepared_bf16_valued_weights() -> None:
    from accord.conformance.cases.linear import linear_cases

    prepared = [c for c in linear_cases(0) if c.prepared and "bf16-valued" in c.name]
    assert {c.row_count() for c in prepared} >= {1, 3, 4, 7}


@pytest.mark.slow
def test_cpu_linear_passes_on_every_weight_form() -> None:
    results = run_linear(get_backend("cpu"))
    assert {r.status for r in results} == {Status.PASS}, [(r.case, r.combo, r.message) for r in results]


def test_cpu_keeps_a_bf16_copy_of_bf16_valued_fp32_weights() -> None:
    if not streams_bf16_weights():
        pytest.skip("no bf16 copies on this host: not an AVX512 CPU with oneDNN and a C compiler")
    from accord.conformance.cases.linear import linear_cases

    case = next(c for c in linear_cases(0) if "bf16-valued" in c.name)
    assert hasattr(get_backend("cpu").prepare_linear_weight(case.args["weight"]), BF16_COPY)


@pytest.mark.slow
def test_rounding_activations_to_bf16_fails_exactly_the_few_row_bf16_valued_cases() -> None:
    results = run_linear(Bf16CopyReference("rounds-x", check_exact=True, round_x=True))
    want = {r.case for r in results if "bf16-valued" in r.case and r.case.startswith(FEW_ROWS)}
    assert len(want) == 8 and failed(results) == want  # 4 few-row shapes, with and without bias


@pytest.mark.slow
def test_a_bf16_copy_of_a_weight_that_is_not_bf16_fails_the_few_row_prepared_fp32_cases() -> None:
    results = run_linear(Bf16CopyReference("inexact-copy", check_exact=False, round_x=False))
    want = {
        (r.case, r.combo) for r in results
        if r.combo in ("x,weight=fp32", "x,weight,bias=fp32") and r.case.endswith(" prepared") and "bf16-valued" not in r.case
        and r.case.startswith(FEW_ROWS)
    }
    assert len(want) == 8 and {(r.case, r.combo) for r in results if r.status is Status.FAIL} == want
