"""Bucketed graph capture of the decode step: persistent input buffers sized for the
largest bucket, one captured graph per batch-size bucket, replay of the smallest bucket
that holds a batch (the rows past the batch padded), eager execution beyond the buckets.

The device decides what capturing means (`Backend.graph_capture`: a CUDA graph on
GPUs, plain re-execution on the CPU); this module only keeps the books: which sizes,
which buffers, what to pad with, what to copy in and slice out. It runs on the CPU with
a backend double in the tests. The step function must read only the buffers it is given
and allocate nothing it returns outside the capture (the contract ops are validated at
capture time: their signatures are fixed by the buffers).
"""

from __future__ import annotations

from bisect import bisect_left
from dataclasses import dataclass
from typing import Callable, Mapping, Protocol

import torch

from ...op_contracts import ContractError

#: A decode step over named input tensors (first dimension = batch rows) to one output
#: tensor (first dimension = batch rows, e.g. logits).
StepFn = Callable[[Mapping[str, torch.Tensor]], torch.Tensor]


class GraphCapturer(Protocol):
    """What the bookkeeping needs of a backend: capture a no-argument step into a
    replayable callable that returns the same (static) output tensor on every replay."""

    def graph_capture(self, fn: Callable[[], torch.Tensor]) -> Callable[[], torch.Tensor]: ...


def capture_sizes(max_batch: int) -> tuple[int, ...]:
    """The batch-size buckets captured for `max_batch` sequences: 1, 2, 4, then every
    multiple of 8 up to the maximum (vLLM's default schedule), the maximum included."""
    sizes = {size for size in (1, 2, 4) if size <= max_batch}
    sizes |= set(range(8, max_batch + 1, 8))
    sizes.add(max_batch)
    return tuple(sorted(sizes))


def bucket_for(batch: int, sizes: tuple[int, ...]) -> int | None:
    """The smallest captured size that holds `batch` rows, or None (run eagerly)."""
    index = bisect_left(sizes, batch)
    return sizes[index] if index < len(sizes) else None


@dataclass(frozen=True)
class InputSpec:
    """One persistent input buffer: the per-row shape after the batch dimension, its
    dtype, and the value padding rows hold (a slot id of -1 writes no KV, say)."""

    row_shape: tuple[int, ...]
    dtype: torch.dtype
    pad: float | int = 0


class DecodeGraphs:
    """Captured decode steps per batch-size bucket over one set of persistent buffers."""

    def __init__(
        self,
        capturer: GraphCapturer,
        step: StepFn,
        inputs: Mapping[str, InputSpec],
        sizes: tuple[int, ...],
        device: torch.device | str = "cpu",
    ) -> None:
        if not sizes or list(sizes) != sorted(set(sizes)) or sizes[0] < 1:
            raise ValueError(f"capture sizes must be distinct positive sizes in ascending order, got {sizes}")
        self.capturer = capturer
        self.step = step
        self.specs = dict(inputs)
        self.sizes = sizes
        largest = sizes[-1]
        self.buffers = {
            name: torch.full((largest, *spec.row_shape), spec.pad, dtype=spec.dtype, device=device)
            for name, spec in self.specs.items()
        }
        self._graphs: dict[int, Callable[[], torch.Tensor]] = {}
        self._views: dict[int, tuple[dict[str, torch.Tensor], dict[str, torch.Tensor]]] = {}
        #: The error each bucket the backend did not capture raised, by size.
        self.refused: dict[int, Exception] = {}
        #: How many steps replayed a graph, and how many ran eagerly (outside the buckets).
        self.replays = 0
        self.eager_runs = 0

    def capture(self) -> None:
        """Capture every bucket, the largest first (as CUDA graph pools like it). A bucket
        the backend does not capture is left out, its error in `refused`, and its
        batches run eagerly: a NotImplementedError is the backend declining a step it
        cannot record at that size, anything else a failed capture. A ContractError is
        raised, never taken for either."""
        for size in reversed(self.sizes):
            views = {name: buffer[:size] for name, buffer in self.buffers.items()}
            try:
                self._graphs[size] = self.capturer.graph_capture(lambda views=views: self.step(views))
            except ContractError:
                raise
            except Exception as error:  # noqa: BLE001 - any other failure leaves this bucket eager
                self.refused[size] = error

    @property
    def captured(self) -> tuple[int, ...]:
        """The bucket sizes captured so far."""
        return tuple(sorted(self._graphs))

    def replays_batch(self, batch: int) -> bool:
        """Whether a decode step of `batch` rows would replay a captured graph."""
        return bucket_for(batch, self.sizes) in self._graphs

    def run(self, inputs: Mapping[str, torch.Tensor]) -> torch.Tensor:
        """The step's output rows for `inputs` (every buffer's tensor, `batch` rows):
        replayed in the smallest bucket that holds them if it was captured, else run
        eagerly."""
        if inputs.keys() != self.specs.keys():
            raise ValueError(f"decode inputs must be exactly {sorted(self.specs)}, got {sorted(inputs)}")
        rows = {int(t.shape[0]) for t in inputs.values()}
        if len(rows) != 1:
            raise ValueError(f"decode inputs disagree on the batch size: {sorted(rows)}")
        batch = rows.pop()
        size = bucket_for(batch, self.sizes)
        if size is None or size not in self._graphs:
            self.eager_runs += 1
            return self.step(inputs)
        targets, padding = self._batch_views(batch, size)
        for name, tensor in inputs.items():
            targets[name].copy_(tensor)
        for name, rows in padding.items():
            rows.fill_(self.specs[name].pad)
        self.replays += 1
        output = self._graphs[size]()
        return output if batch == size else output[:batch]

    def _batch_views(self, batch: int, size: int) -> tuple[dict[str, torch.Tensor], dict[str, torch.Tensor]]:
        """The buffers' first `batch` rows and their padding rows up to `size` (none
        when the batch fills its bucket), sliced once per batch size: on a CPU each
        slice costs microseconds, and a decode step replays in well under a millisecond
        of host time."""
        views = self._views.get(batch)
        if views is None:
            targets = {name: buffer[:batch] for name, buffer in self.buffers.items()}
            padding = {name: buffer[batch:size] for name, buffer in self.buffers.items()} if batch < size else {}
            views = self._views[batch] = (targets, padding)
        return views
