"""The cpu backend's graph of a decode step: the native kernel calls one run of the step
makes, recorded, then replayed from one C loop (native_graph.c) with no Python, no
dispatcher and no aten op between them.

A CUDA graph records what the device runs; here the "device work" is the calls into
accord's C kernels (`_native.NativeFunction`), with their pointers and sizes. That is
sound only if the step does nothing else that a replay would have to repeat, so the
capture runs under a dispatch mode that lets through only what a replay needs not redo:
allocations (kept alive by the graph, as a CUDA graph's pool keeps its memory) and views
(ops whose every output is memory an input already had).
An aten op with a native equivalent is lowered to it during the capture (the embedding
gather; `.contiguous()` on a view of contiguous rows, as the split of a fused QKV
projection makes at more than one token); any other one refuses the capture with
`CaptureRefused` naming it, and the step stays eager. Inputs and the KV cache are read
through the pointers recorded, so a replay sees new values in the same buffers, as a
CUDA graph does; each call's result at capture is checked again at replay, so a kernel
that would refuse its inputs (an index out of range) stops the replay with an error
instead of computing something else.
"""

from __future__ import annotations

import ctypes
import threading
from collections.abc import Callable
from functools import cache
from typing import Any

import torch
import torch.utils._pytree as pytree
from torch.utils._python_dispatch import TorchDispatchMode

from . import _native, _native_elementwise

aten = torch.ops.aten

#: The aten ops that only allocate: their outputs are the graph's working memory.
ALLOCATIONS = frozenset({aten.empty.memory_format, aten.empty_like.default, aten.empty_strided.default})


#: The aten forms of `.contiguous()` (under inference mode and outside it), with the
#: memory format each takes when none is given: a contiguous copy is lowered to a native
#: row copy.
CONTIGUOUS_COPIES = {aten.contiguous.default: torch.contiguous_format, aten.clone.default: torch.preserve_format}


class CaptureRefused(NotImplementedError):
    """The step does work a replay of its native calls would not repeat (a
    NotImplementedError: the engine runs such a step eagerly, as expected)."""


class _PackedArg(ctypes.Union):
    _fields_ = [("p", ctypes.c_void_p), ("i", ctypes.c_long), ("d", ctypes.c_double)]


class _GraphCall(ctypes.Structure):
    _fields_ = [("function", ctypes.c_void_p), ("args", ctypes.c_void_p), ("expected", ctypes.c_long)]


@cache
def _library() -> _native.NativeLibrary | None:
    entry = ("accord_graph_replay", ctypes.c_long, (ctypes.c_void_p, ctypes.c_long))
    return _native.load("native_graph.c", (entry,))


def available() -> bool:
    """Whether graphs can be replayed here (the C loop builds)."""
    return _library() is not None


def _memory_of(value: Any) -> int | None:
    """Where a strided tensor's storage starts; None for anything else (a oneDNN
    tensor has no storage a kernel pointer could point into)."""
    if isinstance(value, torch.Tensor) and value.layout == torch.strided:
        return value.untyped_storage().data_ptr()
    return None


def _address(value: Any) -> int:
    """A pointer argument as the address it passed: an int, None, a bytes object (its
    buffer) or a ctypes object."""
    if value is None:
        return 0
    if isinstance(value, int):
        return value
    if isinstance(value, bytes):
        return ctypes.cast(ctypes.c_char_p(value), ctypes.c_void_p).value or 0
    return ctypes.addressof(value)


class NativeGraph:
    """Recorded native calls, replayable in order from C."""

    def __init__(self, calls: list[tuple[_native.NativeFunction, tuple[Any, ...], Any]], memory: list[Any]) -> None:
        #: What the recorded pointers point into: allocations of the step, the calls'
        #: own argument objects (bytes structs); owned here for the graph's lifetime.
        self._memory = memory + [args for _, args, _ in calls]
        self._names = [function.name for function, _, _ in calls]
        packed = (_PackedArg * max(1, sum(len(args) for _, args, _ in calls)))()
        self._calls = (_GraphCall * max(1, len(calls)))()
        position = 0
        for call, (function, args, result) in zip(self._calls, calls):
            call.function, call.args = function.packed, ctypes.addressof(packed) + position * ctypes.sizeof(_PackedArg)
            call.expected = 0 if result is None else int(result)
            for member, value in zip(function.members, args):
                slot = packed[position]
                if member == "p":
                    slot.p = _address(value)
                elif member == "i":
                    slot.i = int(value)
                else:
                    slot.d = float(value)
                position += 1
        self._packed = packed
        self._count = len(calls)
        self._replay = _library().accord_graph_replay  # type: ignore[union-attr]

    def __len__(self) -> int:
        return self._count

    def replay(self) -> None:
        """Run every recorded call again; raises if one gives another result than at
        capture (the calls after it do not run)."""
        failed = self._replay(ctypes.addressof(self._calls), self._count)
        if failed >= 0:
            raise RuntimeError(
                f"replaying the captured step: native call {failed} ({self._names[failed]}) refused its inputs "
                "(an index or position out of range?); the step's outputs are incomplete"
            )


class _CaptureMode(TorchDispatchMode):
    """Lets allocations and views through (keeping every allocation), lowers the aten
    ops with a native equivalent, refuses every other aten op."""

    def __init__(self) -> None:
        super().__init__()
        self.memory: list[torch.Tensor] = []

    @classmethod
    def _should_skip_dynamo(cls) -> bool:
        # Otherwise torch wraps __torch_dispatch__ in torch._disable_dynamo, whose first
        # call imports dynamo: 2-5 s of start-up on a small CPU host. Nothing here runs
        # under torch.compile (a compiled step computes in aten ops and is refused).
        return False

    def __torch_dispatch__(self, func: Any, types: Any, args: tuple = (), kwargs: dict | None = None) -> Any:
        kwargs = kwargs or {}
        if func is aten.embedding.default:
            return self._embedding(*args, **kwargs)
        if func in CONTIGUOUS_COPIES and kwargs.get("memory_format", CONTIGUOUS_COPIES[func]) is torch.contiguous_format:
            if func is aten.clone.default or not args[0].is_contiguous():
                return self._contiguous(args[0])
        if func in ALLOCATIONS:
            out = func(*args, **kwargs)
            self.memory.append(out)
            return out
        if not func._schema.is_mutable:
            # A view, or an op that may return its input as it is (contiguous, reshape):
            # it is one here when every output is memory an input already had.
            out = func(*args, **kwargs)
            inputs = {_memory_of(t) for t in pytree.tree_leaves((args, kwargs))} - {None}
            outputs = [_memory_of(t) for t in pytree.tree_leaves(out)]
            if outputs and all(memory in inputs for memory in outputs):
                return out
        raise CaptureRefused(
            f"{func} computes in torch, outside accord's native kernels, so a replay of the native calls "
            "would skip it"
        )

    def _embedding(self, weight: torch.Tensor, indices: torch.Tensor, padding_idx: int = -1, *rest: Any) -> torch.Tensor:
        out = torch.empty((*indices.shape, weight.shape[1]), dtype=weight.dtype, device=weight.device)
        taken = indices.dim() == 1 and _native_elementwise.embedding(weight, indices, out)
        return self._lowered(out, taken, f"the embedding of {tuple(indices.shape)} {indices.dtype} ids over a "
                                         f"{weight.dtype} table")

    def _contiguous(self, src: torch.Tensor) -> torch.Tensor:
        out = torch.empty(src.shape, dtype=src.dtype, device=src.device)
        taken = _native_elementwise.copy_rows(src, out)
        return self._lowered(out, taken, f"a {src.dtype} copy of shape {tuple(src.shape)} and strides "
                                         f"{src.stride()} to a contiguous tensor")

    def _lowered(self, out: torch.Tensor, taken: bool, what: str) -> torch.Tensor:
        """`out`, which a native kernel wrote (`taken`), kept as the graph's memory; a
        refused capture naming `what` where no native kernel took the op."""
        if not taken:
            raise CaptureRefused(f"{what} has no native kernel")
        self.memory.append(out)
        return out


def capture(step: Callable[[], torch.Tensor]) -> tuple[NativeGraph, torch.Tensor]:
    """Record one run of `step` (after a warm-up run, which validates its contract calls
    and takes every first-call path) as a graph, with the output tensor the run made
    (rewritten in place by every replay)."""
    step()
    calls: list[tuple[_native.NativeFunction, tuple[Any, ...], Any]] = []
    if _native.recorder is not None:
        raise RuntimeError("a native graph capture is already under way")
    capturing = threading.get_ident()

    def record(function: _native.NativeFunction, args: tuple[Any, ...], result: Any) -> None:
        # Another thread's calls (a kernel some other part of the process runs) are not
        # the step's.
        if threading.get_ident() == capturing:
            calls.append((function, args, result))

    _native.recorder = record
    mode = _CaptureMode()
    try:
        with mode:
            output = step()
    finally:
        _native.recorder = None
    return NativeGraph(calls, [*mode.memory, output]), output
