"""A few output values per case, from the backend and from the reference, recorded in
report.json so that `accord conformance merge` can measure how far two vendors' nodes
differ from each other, not only from the reference."""

from __future__ import annotations

import math
from typing import Iterable

import torch

from ...backends import Backend
from ...op_contracts import OpDispatcher, dtype_name
from ...conformance.case import Case
from ...conformance.execute import execute
from ...conformance.results import CaseResult, Status
from .document import CaseKey, OutputSample, SampledOutput

#: Values kept per output: enough for a stable NMSE, small enough for a readable report.
SAMPLE_SIZE = 32


def evenly_spaced(numel: int, size: int) -> torch.Tensor:
    """`size` int64 indices from 0 to numel - 1 inclusive, evenly spaced, in integer
    arithmetic (float32 spacing rounds to numel itself past 2^24 elements)."""
    if size == 1:
        return torch.zeros(1, dtype=torch.int64)
    return torch.arange(size, dtype=torch.int64) * (numel - 1) // (size - 1)


def sample_tensor(tensor: torch.Tensor, size: int = SAMPLE_SIZE) -> SampledOutput:
    """`size` evenly strided elements of the flattened tensor, as floats (non-finite
    values as None, since JSON cannot hold them)."""
    flat = tensor.detach().reshape(-1).cpu()
    if flat.numel() > size:
        flat = flat[evenly_spaced(flat.numel(), size)]
    values = tuple(v if math.isfinite(v) else None for v in flat.double().tolist())
    return SampledOutput(dtype_name(tensor.dtype), values)


def sample_outputs(
    backend: Backend, reference: Backend, cases: Iterable[Case], results: Iterable[CaseResult]
) -> dict[CaseKey, OutputSample]:
    """Re-run every case that ran (passed or failed on its numbers) on both backends and
    sample the outputs. Cases refused, unsupported or crashing have nothing to sample."""
    # A shared kernel still produced outputs: a merge compares them like any other.
    ran = {(r.op, r.combo, r.case) for r in results if r.status in (Status.PASS, Status.FAIL, Status.SHARED)}
    ops, golden = OpDispatcher(backend, strict=True), OpDispatcher(reference, strict=True)
    samples: dict[CaseKey, OutputSample] = {}
    for case in cases:
        if (case.op, case.combo, case.name) not in ran:
            continue
        try:
            got = execute(ops, case, case.fresh_args(backend.device())).outputs
            want = execute(golden, case, case.fresh_args(reference.device())).outputs
        except Exception:  # noqa: BLE001 - the case's result already says why it broke
            continue
        samples[(case.op, case.combo, case.name)] = OutputSample(
            {name: sample_tensor(t) for name, t in got.items()},
            {name: sample_tensor(t) for name, t in want.items()},
        )
    return samples
