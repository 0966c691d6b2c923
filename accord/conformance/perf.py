"""`accord conformance --perf`: each legal case's kernel timed on the backend, as
test-backend-ops' perf mode does, with what it achieved: GFLOP/s for the GEMMs, GB/s
(the bytes of its arguments and outputs, each touched once) for the memory-bound ops,
against the host's measured copy bandwidth (the roofline a memory-bound kernel can
reach). A plugin author sees in one table that a kernel is correct and where it is slow."""

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


@dataclass(frozen=True)
class CasePerf:
    """One case's best call time, and what it achieved: `rate` in `unit` (GFLOP/s or
    GB/s), `roofline` the fraction of the measured copy bandwidth (memory-bound only)."""

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


def _bytes(values: Iterable[Any]) -> int:
    return sum(v.numel() * v.element_size() for v in values if isinstance(v, torch.Tensor))


def time_case(ops: OpDispatcher, backend: Backend, case: Case, bandwidth: float) -> CasePerf:
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
        return CasePerf(case.op, case.name, case.combo, best, flops(case.args) / best / 1e9, "GFLOP/s", None)
    moved = _bytes(case.args.values()) + _bytes(outputs)
    rate = moved / best / 1e9
    return CasePerf(case.op, case.name, case.combo, best, rate, "GB/s", rate / bandwidth)


def run_perf(backend: Backend, cases: Iterable[Case]) -> tuple[float, list[CasePerf]]:
    """(the copy bandwidth in GB/s, each legal case's timing) on `backend`; cases the
    backend refuses are left out (the correctness table reports them)."""
    ops = OpDispatcher(backend)
    bandwidth = copy_bandwidth(backend.device(), backend.synchronize)
    timed = []
    for case in cases:
        if case.expect_refusal:
            continue
        try:
            timed.append(time_case(ops, backend, case, bandwidth))
        except Exception:  # noqa: BLE001 - an unsupported or failing case has its verdict elsewhere
            continue
    return bandwidth, timed


def render_perf(backend_name: str, bandwidth: float, timed: list[CasePerf]) -> str:
    """The perf table: one line per case, the roofline first."""
    lines = [f"perf of backend '{backend_name}': copy bandwidth {bandwidth:.1f} GB/s (the memory-bound roofline)",
             f"{'op':<22} {'case':<44} {'combo':<34} {'us':>9} {'rate':>16} {'roofline':>9}"]
    for t in timed:
        share = "" if t.roofline is None else f"{100 * t.roofline:.0f}%"
        lines.append(f"{t.op:<22} {t.case[:44]:<44} {t.combo[:34]:<34} {t.seconds * 1e6:>9.1f} "
                     f"{t.rate:>8.2f} {t.unit:<7} {share:>9}")
    return "\n".join(lines)
