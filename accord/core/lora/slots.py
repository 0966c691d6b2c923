"""Which adapters are where on one worker: up to `max_loras` resident in device slots
(what a step's tokens can use) and up to `max_cpu_loras` read and kept on the host. A
step's adapters are made resident before its forward; a slot goes to a new adapter in
least-recently-used order, never one the step itself uses, and the host cache drops its
least recently used adapter past its size (read from disk again if asked for again)."""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Iterable, Sequence

import numpy as np

from ...op_contracts import OpDispatcher
from ..distributed import ParallelContext
from ..models.causal_lm import CausalLM
from .layer import LoRABatch, wrap_projections
from .layout import LoRALayout
from .peft import LoRAAdapter, read_adapter
from .request import LoRARequest


class LoRASlots:
    """The device slots and host cache of one model's adapters (this tensor-parallel
    rank's part of each, under `parallel`), and the per-step batch state its LoRALinears read."""

    def __init__(
        self, model: CausalLM, ops: OpDispatcher, max_loras: int, max_lora_rank: int, max_cpu_loras: int,
        parallel: ParallelContext | None = None,
    ) -> None:
        #: The modules' full shapes (what adapters are checked against) and this rank's parts.
        self.layout = LoRALayout.of(model.config, parallel)
        self.max_lora_rank = max_lora_rank
        self.max_cpu_loras = max_cpu_loras
        self.batch: LoRABatch
        self.batch, self._storage = wrap_projections(model, ops, self.layout, max_loras, max_lora_rank)
        self._known: dict[int, LoRARequest] = {}
        self._host: OrderedDict[int, LoRAAdapter] = OrderedDict()
        #: Resident adapter id -> its slot, least recently used first.
        self._resident: OrderedDict[int, int] = OrderedDict()
        self._free = list(range(max_loras - 1, -1, -1))
        #: Unloaded adapters a request of the batch still runs on.
        self._unloading: set[int] = set()

    def register(self, request: LoRARequest) -> None:
        """Learn where adapter `request.lora_int_id` loads from (a request naming it
        arrived). An id loaded again from elsewhere (unloaded, then loaded anew) drops
        the copies of the old adapter."""
        lora_id = request.lora_int_id
        if self._known.get(lora_id, request) != request:
            self._host.pop(lora_id, None)
            slot = self._resident.pop(lora_id, None)
            if slot is not None:
                self._free.append(slot)
        self._known[lora_id] = request

    def unload(self, lora_ids: Iterable[int], in_use: set[int]) -> None:
        """Adapters `lora_ids` were unloaded: free the slot and host copy of each, and
        forget where it loads from, once no request in `in_use` (the batch's adapters)
        runs on it; until then it stays, and a later call frees it."""
        self._unloading.update(lora_ids)
        for lora_id in self._unloading - in_use:
            self._host.pop(lora_id, None)
            self._known.pop(lora_id, None)
            slot = self._resident.pop(lora_id, None)
            if slot is not None:
                self._free.append(slot)
        self._unloading &= in_use

    @property
    def host_cached(self) -> set[int]:
        """The ids of the adapters read and kept on the host now."""
        return set(self._host)

    @property
    def resident(self) -> dict[int, int]:
        """Adapter id -> device slot of the adapters resident now."""
        return dict(self._resident)

    def slots_for(self, lora_ids: Sequence[int]) -> np.ndarray:
        """Each request's device slot (int32, -1 for the base model, id 0), making the
        step's adapters resident first. Raises RuntimeError when the step names more
        adapters than there are slots (the scheduler never schedules such a step)."""
        wanted = {lora_id for lora_id in lora_ids if lora_id}
        if len(wanted) > len(self._resident) + len(self._free):
            raise RuntimeError(f"a step uses {len(wanted)} LoRA adapters, more than the {len(self._resident) + len(self._free)} "
                               "device slots (max_loras)")
        for lora_id in wanted & self._resident.keys():
            self._resident.move_to_end(lora_id)
        for lora_id in sorted(wanted - self._resident.keys()):
            self._load(self._take_slot(wanted), self._adapter(lora_id))
        return np.fromiter((self._resident[i] if i else -1 for i in lora_ids), np.int32, len(lora_ids))

    def _take_slot(self, keep: set[int]) -> int:
        if self._free:
            return self._free.pop()
        victim = next(lora_id for lora_id in self._resident if lora_id not in keep)
        return self._resident.pop(victim)

    def _adapter(self, lora_id: int) -> LoRAAdapter:
        """The adapter's host copy, read from its directory unless cached."""
        adapter = self._host.get(lora_id)
        if adapter is None:
            adapter = self._host[lora_id] = read_adapter(self._known[lora_id], self.layout, self.max_lora_rank)
            while len(self._host) > self.max_cpu_loras:
                self._host.popitem(last=False)
        self._host.move_to_end(lora_id)
        return adapter

    def _load(self, slot: int, adapter: LoRAAdapter) -> None:
        """Copy `adapter` into device slot `slot` (zeroing what it does not target)."""
        for weights in self._storage.values():
            weights.lora_a[slot].zero_()
            weights.lora_b[slot].zero_()
        rank, width = adapter.rank, self.max_lora_rank
        for (layer, module), (a, b) in adapter.weights.items():
            shape = self.layout.modules[module]
            weights = self._storage[(layer, shape.projection)]
            cols = slice(shape.slice_index * width, shape.slice_index * width + rank)
            row = weights.row_offsets[shape.slice_index]
            (in_start, in_stop), (out_start, out_stop) = shape.local_in, shape.local_out
            weights.lora_a[slot, cols].copy_(a[:, in_start:in_stop])
            weights.lora_b[slot, cols, row : row + out_stop - out_start].copy_(b[out_start:out_stop].t())
        self._resident[adapter.request.lora_int_id] = slot
