"""The lora_linear contract: the cpu kernel passes every conformance case against the
reference (mixed slots, base rows, ranks 8-64, unused NaN slots), and conformance
catches a kernel that reads slot -1 as the last slot; each dot path the native kernel
has built here matches an fp64 einsum and gives a row alone its bits in the batch, and a
slot id out of range is refused."""

from __future__ import annotations

import dataclasses

import pytest
import torch

from accord.backends import Backend, get_backend
from accord.backends.cpu.kernels import _native_lora
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



@pytest.mark.parametrize("path, dtype", [("fp32", torch.float32), ("fp32", torch.bfloat16), ("dpbf16", torch.bfloat16)])
def test_each_native_path_matches_fp64_and_gives_a_row_alone_the_same_bits(path: str, dtype: torch.dtype) -> None:
    if path not in _native_lora.compiled_paths():
        pytest.skip(f"lora_linear.c's {path} path is not built on this host (no C compiler, or no AVX512-BF16)")
    g = torch.Generator().manual_seed(0)
    tokens, depth, width, slots, rank = 45, 200, 136, 6, 24  # threaded, with tails in every loop
    y, x = torch.randn(tokens, width, generator=g), torch.randn(tokens, depth, generator=g)
    lora_a = torch.randn(slots, rank, depth, generator=g) * depth**-0.5
    lora_b = torch.randn(slots, rank, width, generator=g) * rank**-0.5
    y, x, lora_a, lora_b = (t.to(dtype) for t in (y, x, lora_a, lora_b))
    slot_ids = torch.randint(-1, slots, (tokens,), generator=g, dtype=torch.int32)
    out = torch.empty_like(y)
    _native_lora.lora_linear(y, x, lora_a, lora_b, slot_ids, out, path=path)
    ids = slot_ids.long().clamp(min=0)
    delta = torch.einsum("tk,trk,trn->tn", x.double(), lora_a[ids].double(), lora_b[ids].double())
    want = y.double() + delta * (slot_ids >= 0).unsqueeze(1)
    tolerance = 1e-5 if dtype is torch.float32 else 2e-2
    torch.testing.assert_close(out.double(), want, rtol=tolerance, atol=tolerance)
    for row in (0, 17, tokens - 1):
        alone = torch.empty_like(y[row : row + 1])
        _native_lora.lora_linear(y[row : row + 1], x[row : row + 1], lora_a, lora_b, slot_ids[row : row + 1], alone,
                                 path=path)
        assert torch.equal(alone, out[row : row + 1])


def test_a_slot_id_out_of_range_is_refused_before_anything_is_written() -> None:
    if not _native_lora.available():
        pytest.skip("lora_linear.c is not built on this host (no C compiler)")
    y, out = torch.zeros(2, 8), torch.full((2, 8), 7.0)
    with pytest.raises(ValueError, match=r"a slot id outside \[-1, S\)"):
        _native_lora.lora_linear(y, torch.zeros(2, 4), torch.zeros(2, 3, 4), torch.zeros(2, 3, 8),
                                 torch.tensor([0, 2], dtype=torch.int32), out)
    assert torch.equal(out, torch.full((2, 8), 7.0))
