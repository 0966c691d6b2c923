"""`OffloadingConnector` (vLLM's name; what `--kv-offloading-size` GiB sets up): a
CPU-memory tier under the device's KV pool. Every full block a step computes is copied
to a CPU slot (write-through, as vLLM's offloading connector does), so a block evicted
from the device pool still has its KV on the host; a request whose prefix misses the
device's prefix cache but hits the tier has those blocks copied back instead of
recomputed.

The tier is keyed by the block manager's own hash chain, so a block has one name in
every tier. The scheduler half owns the directory (key -> CPU slot, least recently
used evicted first) and names every copy by slot; the worker half holds the CPU
tensors and does the copies, before the forward (loads) and after it (saves), so a
slot loaded and reassigned in one step is read before it is written.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Hashable, Sequence
from dataclasses import dataclass, field

import torch

from ...op_contracts import OpDispatcher
from .base import KVConnectorMetadata, KVConnectorScheduler, KVConnectorWorker, ScheduledChunk, TransferRequest
from .config import KVTransferConfig, num_cpu_blocks

@dataclass
class BlockCopies(KVConnectorMetadata):
    """One step's copies between device blocks and CPU slots, as (device block, slot)."""

    to_device: list[tuple[int, int]] = field(default_factory=list)
    to_host: list[tuple[int, int]] = field(default_factory=list)
    #: The key each `to_host` copy stores (the scheduler's, should the step fail).
    stored_keys: list[Hashable] = field(default_factory=list)

    def __bool__(self) -> bool:
        return bool(self.to_device or self.to_host)


class OffloadingScheduler(KVConnectorScheduler):
    """The tier's directory: which block keys it holds, in which slot, LRU first."""

    uses_block_keys = True

    def __init__(self, config: KVTransferConfig, block_size: int, bytes_per_block: int) -> None:
        super().__init__(config, block_size, bytes_per_block)
        self.num_slots = num_cpu_blocks(config, bytes_per_block)
        #: key -> slot, least recently used first.
        self._slots: OrderedDict[Hashable, int] = OrderedDict()
        self._free_slots = list(range(self.num_slots - 1, -1, -1))
        self._to_device: list[tuple[int, int]] = []
        #: Blocks loaded back from the tier, and stored into it (counters).
        self.blocks_loaded = 0
        self.blocks_stored = 0

    def __contains__(self, key: Hashable) -> bool:
        return key in self._slots

    def get_num_new_matched_tokens(self, request: TransferRequest, num_computed_tokens: int) -> int:
        # The keys are of full blocks of all tokens but the last.
        hits = 0
        for key in request.block_keys[num_computed_tokens // self.block_size :]:
            if key not in self._slots:
                break
            hits += 1
        return hits * self.block_size

    def update_state_after_alloc(
        self, request: TransferRequest, block_ids: Sequence[int], num_computed_tokens: int, num_external_tokens: int
    ) -> None:
        first = num_computed_tokens // self.block_size
        for index in range(first, first + num_external_tokens // self.block_size):
            key = request.block_keys[index]
            self._slots.move_to_end(key)
            self._to_device.append((block_ids[index], self._slots[key]))
        self.blocks_loaded += num_external_tokens // self.block_size

    def build_connector_meta(self, chunks: Sequence[ScheduledChunk]) -> BlockCopies:
        copies = BlockCopies(to_device=self._to_device)
        self._to_device = []
        loading = {slot for _, slot in copies.to_device}
        for chunk in chunks:
            keys = chunk.request.block_keys
            # The blocks this step fills (their keys were registered as it was scheduled).
            for index in range(chunk.num_computed_tokens // self.block_size, len(keys)):
                key = keys[index]
                if key in self._slots:
                    self._slots.move_to_end(key)
                    continue
                slot = self._take_slot(loading)
                if slot is None:
                    break
                self._slots[key] = slot
                copies.to_host.append((chunk.block_ids[index], slot))
                copies.stored_keys.append(key)
                self.blocks_stored += 1
        return copies

    def _take_slot(self, loading: set[int]) -> int | None:
        """A free slot, else the least recently used one's (not one this step loads
        from: loads run first, but keeping them apart keeps the directory simple)."""
        if self._free_slots:
            return self._free_slots.pop()
        for key, slot in self._slots.items():
            if slot not in loading:
                del self._slots[key]
                return slot
        return None

    def request_finished(self, request: TransferRequest) -> None:
        return None

    def step_failed(self, metadata: KVConnectorMetadata) -> None:
        # Those slots were never written: forget their keys, so no prefix is served from
        # them (unless a later step already gave the slot to another key).
        for key, (_, slot) in zip(metadata.stored_keys, metadata.to_host):  # type: ignore[attr-defined]
            if self._slots.get(key) == slot:
                del self._slots[key]
                self._free_slots.append(slot)
                self.blocks_stored -= 1


class OffloadingWorker(KVConnectorWorker):
    """The CPU tier's tensors (one per cache tensor, [slots, block_size, ...]) and the
    block copies between them and the device cache."""

    def __init__(self, config: KVTransferConfig, block_size: int, rank: int, ops: OpDispatcher) -> None:
        super().__init__(config, block_size, rank, ops)
        self.host: list[tuple[torch.Tensor, ...]] = []

    def register_kv_caches(self, kv_caches: list[tuple[torch.Tensor, ...]]) -> None:
        super().register_kv_caches(kv_caches)
        bytes_per_block = sum(t[0].numel() * t.element_size() for cache in kv_caches for t in cache)
        slots = num_cpu_blocks(self.config, bytes_per_block)
        pin = any(t.device.type == "cuda" for cache in kv_caches for t in cache)
        self.host = [
            tuple(torch.empty((slots, *t.shape[1:]), dtype=t.dtype, pin_memory=pin) for t in cache)
            for cache in kv_caches
        ]

    @staticmethod
    def _indices(pairs: list[tuple[int, int]], device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
        blocks, slots = zip(*pairs)
        return torch.tensor(blocks, device=device), torch.tensor(slots)

    def start_load_kv(self, metadata: KVConnectorMetadata) -> None:
        pairs = metadata.to_device  # type: ignore[attr-defined]
        if not pairs:
            return
        for cache, host in zip(self.kv_caches, self.host):
            blocks, slots = self._indices(pairs, cache[0].device)
            for tensor, stored in zip(cache, host):
                tensor[blocks] = stored[slots].to(tensor.device)

    def wait_for_layer_load(self, layer: int) -> None:
        """Loads are synchronous: done when start_load_kv returns."""

    def save_kv_layer(self, layer: int, metadata: KVConnectorMetadata) -> None:
        pairs = metadata.to_host  # type: ignore[attr-defined]
        if not pairs:
            return
        blocks, slots = self._indices(pairs, self.kv_caches[layer][0].device)
        for tensor, stored in zip(self.kv_caches[layer], self.host[layer]):
            stored[slots] = tensor[blocks].cpu()

    def wait_for_save(self) -> None:
        """Saves are synchronous: done when save_kv_layer returns."""
