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

An optional local-disk tier sits under the CPU tier (`kv_connector_extra_config`:
`disk_path`, `disk_bytes_to_use`): a block the CPU tier evicts is written to a file
named by its key (the SHA-256 chain in hex, the same name on every instance), the
disk's least recently used file is deleted when it is full, and a prefix hit on disk
is read straight into the device blocks. Demotions are written before the forward,
while the slot still holds the evicted block (the step's saves overwrite it after).
"""

from __future__ import annotations

import os
from collections import OrderedDict
from collections.abc import Hashable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import torch
from safetensors.torch import load_file, save_file

from ...op_contracts import OpDispatcher
from .base import KVConnectorMetadata, KVConnectorScheduler, KVConnectorWorker, ScheduledChunk, TransferRequest
from .config import DISK_PATH_KEY, KVTransferConfig, num_cpu_blocks, num_disk_blocks

@dataclass
class BlockCopies(KVConnectorMetadata):
    """One step's copies between device blocks and CPU slots, as (device block, slot)."""

    to_device: list[tuple[int, int]] = field(default_factory=list)
    to_host: list[tuple[int, int]] = field(default_factory=list)
    #: The key each `to_host` copy stores (the scheduler's, should the step fail).
    stored_keys: list[Hashable] = field(default_factory=list)
    #: Disk tier: CPU slots written to disk before they are reused, as (slot, file
    #: name); files read into device blocks, as (device block, file name); files deleted.
    to_disk: list[tuple[int, str]] = field(default_factory=list)
    from_disk: list[tuple[int, str]] = field(default_factory=list)
    disk_dropped: list[str] = field(default_factory=list)

    def __bool__(self) -> bool:
        return bool(self.to_device or self.to_host or self.to_disk or self.from_disk or self.disk_dropped)


def disk_name(key: Hashable) -> str:
    """A block's file name in the disk tier: its SHA-256 chain key in hex (the block
    manager's key, so every instance names a prefix's blocks alike)."""
    if not isinstance(key, bytes):
        raise ValueError("the disk KV tier needs prefix_caching_hash_algo 'sha256' (its file names are the block keys)")
    return key.hex()


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
        #: The disk tier's directory: keys on disk, least recently used first.
        self.num_disk_slots = num_disk_blocks(config, bytes_per_block)
        self._disk: OrderedDict[Hashable, None] = OrderedDict()
        self._from_disk: list[tuple[int, str]] = []
        #: Blocks loaded back from the tier, and stored into it (counters); of them,
        #: blocks read from disk, and blocks the CPU tier evicted to disk.
        self.blocks_loaded = 0
        self.blocks_stored = 0
        self.blocks_loaded_from_disk = 0
        self.blocks_demoted = 0

    def __contains__(self, key: Hashable) -> bool:
        return key in self._slots or key in self._disk

    def holds(self, key: Hashable) -> bool:
        return key in self._slots

    def get_num_new_matched_tokens(self, request: TransferRequest, num_computed_tokens: int) -> int:
        # The keys are of full blocks of all tokens but the last.
        hits = 0
        for key in request.block_keys[num_computed_tokens // self.block_size :]:
            if key not in self:
                break
            hits += 1
        return hits * self.block_size

    def update_state_after_alloc(
        self, request: TransferRequest, block_ids: Sequence[int], num_computed_tokens: int, num_external_tokens: int
    ) -> None:
        first = num_computed_tokens // self.block_size
        for index in range(first, first + num_external_tokens // self.block_size):
            key = request.block_keys[index]
            if key in self._slots:
                self._slots.move_to_end(key)
                self._to_device.append((block_ids[index], self._slots[key]))
            else:
                self._disk.move_to_end(key)
                self._from_disk.append((block_ids[index], disk_name(key)))
                self.blocks_loaded_from_disk += 1
        self.blocks_loaded += num_external_tokens // self.block_size

    def build_connector_meta(self, chunks: Sequence[ScheduledChunk]) -> BlockCopies:
        copies = BlockCopies(to_device=self._to_device, from_disk=self._from_disk)
        self._to_device, self._from_disk = [], []
        loading = {slot for _, slot in copies.to_device}
        for chunk in chunks:
            keys = chunk.request.block_keys
            # The blocks this step fills (their keys were registered as it was scheduled).
            for index in range(chunk.num_computed_tokens // self.block_size, len(keys)):
                key = keys[index]
                if key in self._slots:
                    self._slots.move_to_end(key)
                    continue
                slot = self._take_slot(loading, copies)
                if slot is None:
                    break
                self._slots[key] = slot
                copies.to_host.append((chunk.block_ids[index], slot))
                copies.stored_keys.append(key)
                self.blocks_stored += 1
        return copies

    def _take_slot(self, loading: set[int], copies: BlockCopies) -> int | None:
        """A free slot, else the least recently used one's (not one this step loads
        from: loads run first, but keeping them apart keeps the directory simple),
        its block demoted to the disk tier where there is one."""
        if self._free_slots:
            return self._free_slots.pop()
        for key, slot in self._slots.items():
            if slot not in loading:
                del self._slots[key]
                self._demote(key, slot, copies)
                return slot
        return None

    def _demote(self, key: Hashable, slot: int, copies: BlockCopies) -> None:
        """Plan writing `slot`'s block to disk as `key`, deleting the disk's least
        recently used file if it is full."""
        if not self.num_disk_slots or key in self._disk:
            return
        if len(self._disk) >= self.num_disk_slots:
            dropped, _ = self._disk.popitem(last=False)
            copies.disk_dropped.append(disk_name(dropped))
        self._disk[key] = None
        copies.to_disk.append((slot, disk_name(key)))
        self.blocks_demoted += 1

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
        # The step's demotions may not all be on disk: forget them (they are recomputed).
        demoted = {name for _, name in metadata.to_disk}  # type: ignore[attr-defined]
        for key in [key for key in self._disk if disk_name(key) in demoted]:
            del self._disk[key]


class OffloadingWorker(KVConnectorWorker):
    """The CPU tier's tensors (one per cache tensor, [slots, block_size, ...]) and the
    block copies between them and the device cache."""

    def __init__(self, config: KVTransferConfig, block_size: int, rank: int, ops: OpDispatcher) -> None:
        super().__init__(config, block_size, rank, ops)
        self.host: list[tuple[torch.Tensor, ...]] = []
        disk_path = config.kv_connector_extra_config.get(DISK_PATH_KEY)
        #: This rank's directory of the disk tier (None: no disk tier).
        self.disk_root: Path | None = None if not disk_path else Path(disk_path) / f"rank{rank}"
        if self.disk_root is not None:
            self.disk_root.mkdir(parents=True, exist_ok=True)

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

    def _disk_file(self, name: str) -> Path:
        assert self.disk_root is not None, "a disk tier copy without a disk tier"
        return self.disk_root / f"{name}.safetensors"

    def _sync_disk(self, copies: BlockCopies) -> None:
        """The step's disk work, before its forward: evicted CPU slots written out
        (under a temporary name, then renamed: a reader sees a whole file or none),
        dropped files deleted, disk hits read into their device blocks."""
        for slot, name in copies.to_disk:
            # Clones: safetensors refuses tensors that share one storage (the slot views).
            tensors = {f"{layer}.{index}": stored[slot].clone() for layer, host in enumerate(self.host)
                       for index, stored in enumerate(host)}
            path = self._disk_file(name)
            temporary = path.with_name(f".{path.name}.{os.getpid()}.tmp")
            save_file(tensors, str(temporary))
            os.replace(temporary, path)
        for name in copies.disk_dropped:
            self._disk_file(name).unlink(missing_ok=True)
        for block, name in copies.from_disk:
            tensors = load_file(str(self._disk_file(name)))
            for layer, cache in enumerate(self.kv_caches):
                for index, tensor in enumerate(cache):
                    tensor[block] = tensors[f"{layer}.{index}"].to(tensor.device)

    def start_load_kv(self, metadata: KVConnectorMetadata) -> None:
        self._sync_disk(metadata)  # type: ignore[arg-type]
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
