"""The lora_linear contract: the cpu kernel passes every conformance case against the
reference (mixed slots, base rows, ranks 8-64, unused NaN slots), and conformance
catches a kernel that reads slot -1 as the last slot."""

from __future__ import annotations

import dataclasses

import torch

from accord.backends import Backend, get_backend
from accord.conformance import ConformanceRunner, Status
from accord.op_contracts import KernelSet


def results_of(backend: Backend) -> dict[str, Status]:
    return {f"{r.case} [{r.combo}]": r.status for r in ConformanceRunner(backend, get_backend("reference")).run_op("lora_linear")}


class LoraDouble(Backend):
    """The reference backend with its lora_linear replaced by `fn`."""

    device_type = "cpu"

    def __init__(self, name: str, fn) -> None:
        super().__init__()
        self.name = name
        self._fn = fn

    def load_kernels(self) -> KernelSet:
        kernels = KernelSet()
        for op, kernel in get_backend("reference").kernels().as_dict().items():
            # Every kernel behind a function of its own, so none is reported shared.
            fn = self._fn if op == "lora_linear" else own_function(kernel.fn)
            kernels.add(dataclasses.replace(kernel, fn=fn))
        return kernels


def own_function(fn):
    """`fn` behind a function object of its own."""
    return lambda **call: fn(**call)


def reads_minus_one_as_last_slot(y, x, lora_a, lora_b, slot_ids, out) -> None:
    """Indexes the slots with -1 unchecked (Python's and C's negative index: the last slot)."""
    ids = slot_ids.long()
    out.copy_((y.double() + torch.einsum("tk,trk,trn->tn", x.double(), lora_a[ids].double(), lora_b[ids].double())))


def test_cpu_lora_linear_passes_every_case() -> None:
    results = results_of(get_backend("cpu"))
    assert len(results) >= 21
    assert set(results.values()) <= {Status.PASS, Status.REFUSED}, results
    assert Status.PASS in results.values()


def test_a_kernel_applying_the_last_slot_to_base_rows_fails_the_cases_with_base_rows() -> None:
    results = results_of(LoraDouble("minus-one-bug", reads_minus_one_as_last_slot))
    failed = {case for case, status in results.items() if status is Status.FAIL}
    assert any(case.startswith("base rows only") for case in failed)
    assert any(case.startswith("mixed slots") for case in failed)
    assert not any(case.startswith(("one adapter only", "one decode row")) for case in failed)

