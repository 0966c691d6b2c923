"""`accord conformance --perf`: each legal case's kernel timed on the backend, as
test-backend-ops' perf mode does, with what it achieved against a roofline measured on
this host: GFLOP/s for the GEMMs, against a large square torch.matmul in the case's
dtype (the device's GEMM library at full size: what a GEMM kernel can be asked to
reach), and GB/s (the bytes of its arguments and outputs, each touched once) for the
memory-bound ops, against a plain device copy. A plugin author sees in one table that a
kernel is correct and where it is slow."""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any, Callable, Iterable, Mapping

import torch

from ..backends import Backend
from ..op_contracts import OpDispatcher
from .case import Case

#: Timed calls per case (the best one counts: the least disturbed by a busy host).
REPEATS = 5
#: The copy the bandwidth roofline is measured with.
COPY_BYTES = 64 << 20
#: The side of the square matmul the GEMM roofline is measured with, per dtype: big
#: enough for the GEMM library's full-speed path, small enough to take well under a
#: second where the dtype is emulated.
ROOF_GEMM_SIZE = 512


@dataclass(frozen=True)
class CasePerf:
    """One case's best call time, and what it achieved: `rate` in `unit` (GFLOP/s or
    GB/s), `roofline` its fraction of the measured roofline: the copy bandwidth, or for
    a GEMM the large matmul's rate in its dtype (None for fp8 and int8 operands, which
    have no such ceiling)."""

    op: str
    case: str
    combo: str
    seconds: float
    rate: float
    unit: str
    roofline: float | None


#: FLOPs of the GEMM-shaped ops' calls (2 per multiply-add); other ops are memory-bound.
FLOPS: dict[str, Callable[[Mapping[str, Any]], float]] = {
    "linear": lambda c: 2.0 * c["x"].shape[0] * c["x"].shape[1] * c["weight"].shape[0],
    "scaled_mm": lambda c: 2.0 * c["a"].shape[0] * c["a"].shape[1] * c["b"].shape[0],
    # Per routed pick: the gate/up GEMM (2I x H) and the down GEMM (H x I).
    "fused_moe": lambda c: 2.0 * c["topk_ids"].numel() * 3 * c["w2"].shape[1] * c["w2"].shape[2],
}
#: The operand whose dtype a GEMM-shaped op's roofline is measured in.
GEMM_OPERAND = {"linear": "x", "scaled_mm": "a", "fused_moe": "hidden"}


def copy_bandwidth(device: torch.device, synchronize: Callable[[], None]) -> float:
    """GB/s of a plain device copy (read + write), best of REPEATS."""
    source = torch.empty(COPY_BYTES // 4, dtype=torch.float32, device=device).fill_(1.0)
    target = torch.empty_like(source)
    best = float("inf")
    for _ in range(REPEATS):
        synchronize()
        started = time.perf_counter()
        target.copy_(source)
        synchronize()
        best = min(best, time.perf_counter() - started)
    return 2 * COPY_BYTES / best / 1e9


class Rooflines:
    """The host's measured ceilings: the copy bandwidth, and the GEMM rate per dtype
    (measured when a case first needs it)."""

    def __init__(self, device: torch.device, synchronize: Callable[[], None]) -> None:
        self.device, self.synchronize = device, synchronize
        self.bandwidth = copy_bandwidth(device, synchronize)
        self._gemm: dict[torch.dtype, float | None] = {}

    def gemm(self, dtype: torch.dtype) -> float | None:
        """GFLOP/s of a ROOF_GEMM_SIZE-cube matmul in `dtype`, best of REPEATS; None
        for 1-byte dtypes and where torch has no matmul for it."""
        if dtype not in self._gemm:
            self._gemm[dtype] = self._measure_gemm(dtype)
        return self._gemm[dtype]

    def gemm_rates(self) -> dict[torch.dtype, float]:
        """The GEMM rooflines measured so far, by dtype."""
        return {dtype: rate for dtype, rate in self._gemm.items() if rate is not None}

    def _measure_gemm(self, dtype: torch.dtype) -> float | None:
        if dtype.itemsize == 1:
            # fp8 and int8 GEMMs have no torch.matmul ceiling to compare with: CUDA has
            # none, and the CPU's is a slow emulation any dequantising kernel beats.
            return None
        size = ROOF_GEMM_SIZE
        try:
            a = torch.randn(size, size, device=self.device).to(dtype)
            b = torch.randn(size, size, device=self.device).to(dtype)
            torch.matmul(a, b)
        except (RuntimeError, TypeError, NotImplementedError):  # e.g. no fp8 or integer matmul
            return None
        best = float("inf")
        for _ in range(REPEATS):
            self.synchronize()
            started = time.perf_counter()
            torch.matmul(a, b)
            self.synchronize()
            best = min(best, time.perf_counter() - started)
        return 2.0 * size**3 / best / 1e9


def _bytes(values: Iterable[Any]) -> int:
    return sum(v.numel() * v.element_size() for v in values if isinstance(v, torch.Tensor))


def time_case(ops: OpDispatcher, backend: Backend, case: Case, roofs: Rooflines) -> CasePerf:
    """The best of REPEATS calls of `case` (after one warm-up), with its rate."""
    args = case.fresh_args(backend.device())
    for name in case.prepared:
        args[name] = ops.prepare_linear_weight(args[name])
    returned = ops.call(case.contract, (), args)
    outputs = returned if isinstance(returned, tuple) else () if returned is None else (returned,)
    best = float("inf")
    for _ in range(REPEATS):
        backend.synchronize()
        started = time.perf_counter()
        ops.call(case.contract, (), args)
        backend.synchronize()
        best = min(best, time.perf_counter() - started)
    flops = FLOPS.get(case.op)
    if flops is not None:
        rate = flops(case.args) / best / 1e9
        roof = roofs.gemm(case.args[GEMM_OPERAND[case.op]].dtype)
        return CasePerf(case.op, case.name, case.combo, best, rate, "GFLOP/s", None if roof is None else rate / roof)
    moved = _bytes(case.args.values()) + _bytes(outputs)
    rate = moved / best / 1e9
    return CasePerf(case.op, case.name, case.combo, best, rate, "GB/s", rate / roofs.bandwidth)


def run_perf(backend: Backend, cases: Iterable[Case]) -> tuple[Rooflines, list[CasePerf]]:
    """(the host's rooflines, each legal case's timing) on `backend`; cases the backend
    refuses are left out (the correctness table reports them)."""
    ops = OpDispatcher(backend)
    roofs = Rooflines(backend.device(), backend.synchronize)
    timed = []
    for case in cases:
        if case.expect_refusal:
            continue
        try:
            timed.append(time_case(ops, backend, case, roofs))
        except Exception:  # noqa: BLE001 - an unsupported or failing case has its verdict elsewhere
            continue
    return roofs, timed


def render_perf(backend_name: str, roofs: Rooflines, timed: list[CasePerf]) -> str:
    """The perf table: one line per case, the rooflines first."""
    gemm = ", ".join(f"{str(dtype).removeprefix('torch.')} {rate:.1f}" for dtype, rate in roofs.gemm_rates().items())
    lines = [f"perf of backend '{backend_name}': copy bandwidth {roofs.bandwidth:.1f} GB/s (the memory-bound roofline)"]
    if gemm:
        lines.append(f"GEMM roofline, GFLOP/s of a {ROOF_GEMM_SIZE}-cube torch.matmul: {gemm}")
    lines.append(f"{'op':<22} {'case':<44} {'combo':<34} {'us':>9} {'rate':>16} {'roofline':>9}")
    for t in timed:
        share = "" if t.roofline is None else f"{100 * t.roofline:.0f}%"
        lines.append(f"{t.op:<22} {t.case[:44]:<44} {t.combo[:34]:<34} {t.seconds * 1e6:>9.1f} "
                     f"{t.rate:>8.2f} {t.unit:<7} {share:>9}")
    return "\n".join(lines)
