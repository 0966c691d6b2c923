"""Records the op calls a real engine makes, so the gate can run conformance at the
shapes and dtypes the deploy config actually produces (not only the standard cases).

The engine takes a backend by name and builds its own dispatcher, so the recorder
wraps the backend's `kernel_for` for the duration of a `with` block: every kernel the
dispatcher plans with is then a recording copy of the real one."""

from __future__ import annotations

import dataclasses
from contextlib import contextmanager
from typing import Any, Iterator

import torch

from ..backends import Backend
from ..op_contracts import CONTRACTS, Kernel
from .case import Case, dtype_combo

#: Distinct shapes kept per (op, dtype combination): prefill, decode and a mixed step.
MAX_SHAPES_PER_SIGNATURE = 3
#: Host memory all recorded copies may take together; later calls that do not fit are
#: counted, not kept (their ops still run the standard cases).
MAX_RECORDED_BYTES = 2 << 30


class CallRecorder:
    """Keeps copies of the inputs of the first calls of each op signature (up to a few
    shapes each, profile_run's maxima among them); `cases()` turns them into cases."""

    def __init__(self) -> None:
        self.calls: dict[tuple[str, str], dict[tuple[Any, ...], dict[str, Any]]] = {}
        self.ops_called: list[str] = []
        self.too_large = 0
        self.recorded_bytes = 0

    def record(self, op: str, call: dict[str, Any]) -> None:
        """Note one call's inputs (outputs the dispatcher allocated are left out)."""
        if op not in self.ops_called:
            self.ops_called.append(op)
        contract = CONTRACTS[op]
        inputs = {name: call[name] for name in contract.arg_names}
        shapes = tuple(tuple(v.shape) if isinstance(v, torch.Tensor) else v for v in inputs.values())
        seen = self.calls.setdefault((op, dtype_combo(contract, inputs)), {})
        if shapes in seen or len(seen) >= MAX_SHAPES_PER_SIGNATURE:
            return
        size = sum(v.numel() * v.element_size() for v in inputs.values() if isinstance(v, torch.Tensor))
        if self.recorded_bytes + size > MAX_RECORDED_BYTES:
            self.too_large += 1
            return
        self.recorded_bytes += size
        # Copies go to host memory, so recording during profile_run does not shrink the
        # device memory the engine then sizes its KV cache from; and they are made
        # outside inference_mode, so the conformance run may write into them.
        with torch.inference_mode(False):
            seen[shapes] = {k: v.to("cpu", copy=True) if isinstance(v, torch.Tensor) else v for k, v in inputs.items()}

    def cases(self) -> dict[str, list[Case]]:
        """The recorded calls as cases, by op, named by their shapes (on the host, like
        generated cases: the runner moves them to each backend's device)."""
        by_op: dict[str, list[Case]] = {}
        for (op, _combo), calls in self.calls.items():
            for args in calls.values():
                by_op.setdefault(op, []).append(Case(op, f"recorded {_shape_label(args)}", args))
        return by_op

    def wrap(self, kernel: Kernel) -> Kernel:
        """A copy of `kernel` that records each call before running it."""
        def fn(**call: Any) -> None:
            self.record(kernel.op, call)
            kernel.fn(**call)

        return dataclasses.replace(kernel, fn=fn)


def _shape_label(args: dict[str, Any]) -> str:
    return " ".join(f"{name}={list(v.shape)}" for name, v in args.items() if isinstance(v, torch.Tensor))


@contextmanager
def recording_calls(backend: Backend) -> Iterator[CallRecorder]:
    """Within the block, every kernel `backend` hands out records its calls."""
    recorder = CallRecorder()
    original = backend.kernel_for

    def kernel_for(op: str) -> Kernel | None:
        kernel = original(op)
        return None if kernel is None else recorder.wrap(kernel)

    # An instance attribute shadows the method only for this block (see module doc).
    backend.kernel_for = kernel_for  # type: ignore[method-assign]
    try:
        yield recorder
    finally:
        del backend.kernel_for
