"""group_quant_linear's cases catch the layout bugs an int4 kernel is prone to, each as a
deliberately broken double of the reference (and only where the bug shows), while the
cpu kernel passes every case."""

from __future__ import annotations

from typing import Any, Callable

import pytest
import torch
from conformance_doubles import broken, reference_fn

from accord.backends import get_backend
from accord.backends.cpu.kernels import group_quant as cpu_group_quant
from accord.conformance import CaseResult, ConformanceRunner, Status, cases_for

OP = "group_quant_linear"


def high_nibble_first(**call: Any) -> None:
    """Reads each byte's high nibble as the even code (AWQ-style reversed order)."""
    words = call["qweight"]
    if call["bits"] == 4:
        raw = words.contiguous().view(torch.uint8)
        words = ((raw >> 4) | ((raw & 0xF) << 4)).view(torch.int32).view(words.shape)
    reference_fn(OP)(**{**call, "qweight": words})


def ignoring_g_idx(**call: Any) -> None:
    """Groups channels by k // group_size even where g_idx says otherwise."""
    reference_fn(OP)(**{**call, "g_idx": None})


def ignoring_zero_points(**call: Any) -> None:
    """Treats every weight as symmetric (zero point 2**(bits-1))."""
    reference_fn(OP)(**{**call, "zeros": None})


def results(double: Callable[..., None], wanted: Callable[[str], bool]) -> set[Status]:
    runner = ConformanceRunner(broken("double", OP, double), get_backend("reference"))
    cases = [case for case in cases_for(OP) if not case.expect_refusal and wanted(case.name)]
    assert cases
    return {runner.run_case(case).status for case in cases}


@pytest.mark.parametrize(
    ("double", "caught", "passed"),
    [
        (high_nibble_first, lambda name: name.startswith("int4 asym T=3"), lambda name: name.startswith("int8 sym")),
        (ignoring_g_idx, lambda name: "act-order" in name, lambda name: "act-order" not in name and "T=1 " in name),
        (ignoring_zero_points, lambda name: "zero 0 codes" in name, lambda name: " sym " in name),
    ],
    ids=["nibble order", "g_idx", "zero points"],
)
def test_a_layout_bug_fails_the_cases_where_it_shows(double: Any, caught: Any, passed: Any) -> None:
    assert results(double, caught) == {Status.FAIL}
    assert results(double, passed) == {Status.PASS}


@pytest.mark.parametrize("path", ["native", "torch"])
def test_the_cpu_kernel_passes_every_case_and_refuses_every_illegal_call(
    path: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    if path == "torch":
        # The path a host without a C compiler takes: tiles dequantised by torch ops.
        monkeypatch.setattr(cpu_group_quant, "native_library", lambda: None)
    elif cpu_group_quant.native_library() is None:
        pytest.skip("group_quant_gemm.c does not build on this host (no C compiler)")
    report: list[CaseResult] = ConformanceRunner(get_backend("cpu"), get_backend("reference")).run_op(OP)
    failed = [(r.case, r.message) for r in report if r.status not in (Status.PASS, Status.REFUSED)]
    assert failed == []
    assert {r.status for r in report} == {Status.PASS, Status.REFUSED}
