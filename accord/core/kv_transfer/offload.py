"""`OffloadingConnector` (vLLM's name; what `--kv-offloading-size` GiB sets up): a
CPU-memory tier under the device's KV pool. Every full block a step computes is copied
to a CPU slot (write-through, as vLLM's offloading connector does), so a block evicted
from the device pool still has its KV on the host; a request whose prefix misses the
device's prefix cache but hits the tier has those blocks copied back instead of
recomputed: on the worker's reader thread while the steps go on (base.py; the request
waits meanwhile), or in the admitting step with `async_load` false or several ranks.
The slots and files a load reads stay as they are until the scheduler half hears it
ended (`loads_finished`): no step stores into them, demotes or deletes them meanwhile.

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

Several instances may share one `disk_path` (shared_disk.py): each keeps its files in
its own directory and deletes only those; a prefix that misses this instance's tiers
is looked up in the others' directories, and a whole file found there is hard-linked
into this instance's directory at lookup (then served as its own), so the writer's
eviction cannot remove it before the load. Each instance's `disk_bytes_to_use` bounds
the blocks its own directory names. Each instance marks its directory live while it
runs, and reclaims the directories of stopped ones (at start-up, then every
`disk_reclaim_interval_s`): their newest blocks are adopted, as its least recently
used ones, while its own disk has room, and the rest deleted.
"""

from __future__ import annotations

import os
import time
from collections import OrderedDict
from collections.abc import Collection, Hashable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO

import torch
from safetensors.torch import load_file, save_file

from ...op_contracts import OpDispatcher
from .base import KVConnectorMetadata, KVConnectorScheduler, KVConnectorWorker, ScheduledChunk, TransferRequest
from .config import DISK_PATH_KEY, KVTransferConfig, disk_reclaim_interval_s, num_cpu_blocks, num_disk_blocks
from .shared_disk import KEY_FIELD, WRITTEN, BlockLayout, adopt, block_layout, claim, new_instance_dir, reclaim

@dataclass
class BlockCopies(KVConnectorMetadata):
    """One step's copies between device blocks and CPU slots, as (device block, slot)."""

    to_device: list[tuple[int, int]] = field(default_factory=list)
    to_host: list[tuple[int, int]] = field(default_factory=list)
    #: The key each `to_host` copy stores (the scheduler's, should the step fail).
    stored_keys: list[Hashable] = field(default_factory=list)
    #: Disk tier (file paths relative to each rank's root): CPU slots written to disk
    #: before they are reused, as (slot, block name, path); files read into device
    #: blocks, as (device block, path); files deleted.
    to_disk: list[tuple[int, str, str]] = field(default_factory=list)
    from_disk: list[tuple[int, str]] = field(default_factory=list)
    disk_dropped: list[str] = field(default_factory=list)

    def __bool__(self) -> bool:
        return bool(self.to_device or self.to_host or self.to_disk or self.from_disk or self.disk_dropped
                    or self.async_loads)


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
        #: Asynchronous loads planned since the last step, by request; and what each
        #: running one reads, as (key, CPU slot or disk path), until it ends.
        self._async_loads: dict[str, BlockCopies] = {}
        self._reads: dict[str, list[tuple[Hashable, int | str]]] = {}
        #: The disk tier's directory: keys on disk (-> file path), least recently used
        #: first; this instance's own directory's name, every rank's (root, block
        #: file layout) once the workers tell them, and deletions for the next step.
        self.num_disk_slots = num_disk_blocks(config, bytes_per_block)
        self._disk: OrderedDict[Hashable, str] = OrderedDict()
        self._from_disk: list[tuple[int, str]] = []
        self.instance_dir = new_instance_dir()
        self._disk_ranks: list[tuple[Path, BlockLayout]] = []
        self._disk_dropped: list[str] = []
        #: The flocks that mark this instance's directories live (held while it is),
        #: and when it next looks for stopped instances' directories to reclaim.
        self._liveness: list[IO[bytes]] = []
        self.reclaim_interval_s = disk_reclaim_interval_s(config)
        self._next_reclaim = 0.0
        #: Blocks loaded back from the tier, and stored into it (counters); of them,
        #: blocks read from disk, and blocks the CPU tier evicted to disk.
        self.blocks_loaded = 0
        self.blocks_stored = 0
        self.blocks_loaded_from_disk = 0
        self.blocks_demoted = 0
        #: Blocks hard-linked from another instance's directory at lookup (shared disk
        #: tier); blocks kept from stopped instances' directories, and those directories.
        self.blocks_adopted = 0
        self.blocks_reclaimed = 0
        self.instances_reclaimed = 0

    def __contains__(self, key: Hashable) -> bool:
        return key in self._slots or key in self._disk

    def holds(self, key: Hashable) -> bool:
        return key in self._slots

    def set_worker_metadata(self, metadata: Sequence[tuple[str, BlockLayout] | None]) -> None:
        super().set_worker_metadata(metadata)
        if not self.num_disk_slots:
            return
        self._disk_ranks = [(Path(root), layout) for root, layout in metadata]
        self._liveness = claim([root for root, _ in self._disk_ranks], self.instance_dir)
        self._reclaim()

    def _reclaim(self) -> None:
        """Reclaim stopped instances' directories: their newest blocks join this
        instance's disk as its least recently used ones, while it has room."""
        self._next_reclaim = time.monotonic() + self.reclaim_interval_s
        adopted, reclaimed = reclaim(self._disk_ranks, self.instance_dir, lambda name: bytes.fromhex(name) in self._disk,
                                     self.num_disk_slots - len(self._disk))
        for name, path in adopted:  # newest first: each goes before the one before it
            key = bytes.fromhex(name)
            self._disk[key] = path
            self._disk.move_to_end(key, last=False)
        self.blocks_reclaimed += len(adopted)
        self.instances_reclaimed += reclaimed

    def get_num_new_matched_tokens(self, request: TransferRequest, num_computed_tokens: int) -> tuple[int, bool]:
        # The keys are of full blocks of all tokens but the last.
        hits: list[Hashable] = []
        for key in request.block_keys[num_computed_tokens // self.block_size :]:
            if key not in self and not self._adopt(key, hits):
                break
            hits.append(key)
        return len(hits) * self.block_size, self.loads_async

    def _read_now(self) -> set[int | str]:
        """The slots and disk paths the running asynchronous loads read."""
        return {source for reads in self._reads.values() for _, source in reads}

    def _adopt(self, key: Hashable, keep: list[Hashable]) -> bool:
        """Link `key`'s file from another instance's directory into this one's, making
        room by deleting the least recently used file not in `keep` (this lookup's
        earlier hits) nor loaded this step; False: no instance has it, or no room."""
        if not self._disk_ranks:
            return False
        victim = None
        if len(self._disk) >= self.num_disk_slots:
            busy = set(keep) | {path for _, path in self._from_disk} | self._read_now()
            victim = next((k for k, path in self._disk.items() if k not in busy and path not in busy), None)
            if victim is None:
                return False
        path = adopt(self._disk_ranks, self.instance_dir, disk_name(key))
        if path is None:
            return False
        if victim is not None:
            self._disk_dropped.append(self._disk.pop(victim))
        self._disk[key] = path
        self.blocks_adopted += 1
        return True

    def update_state_after_alloc(
        self, request: TransferRequest, block_ids: Sequence[int], num_computed_tokens: int, num_external_tokens: int
    ) -> None:
        first, count = num_computed_tokens // self.block_size, num_external_tokens // self.block_size
        if not count:
            return
        copies = BlockCopies() if self.loads_async else None
        to_device = self._to_device if copies is None else copies.to_device
        from_disk = self._from_disk if copies is None else copies.from_disk
        reads: list[tuple[Hashable, int | str]] = []
        for index in range(first, first + count):
            key = request.block_keys[index]
            source: int | str
            if key in self._slots:
                self._slots.move_to_end(key)
                source = self._slots[key]
                to_device.append((block_ids[index], source))
            else:
                self._disk.move_to_end(key)
                source = self._disk[key]
                from_disk.append((block_ids[index], source))
                self.blocks_loaded_from_disk += 1
            reads.append((key, source))
        if copies is not None:
            self._async_loads[request.req_id] = copies
            self._reads[request.req_id] = reads
        self.blocks_loaded += count

    def loads_finished(self, finished: Collection[str], failed: Collection[str]) -> None:
        for req_id in finished:
            self._reads.pop(req_id, None)
        # A block that failed to load is forgotten (a later prefix recomputes it), unless
        # another running load still reads it.
        forget = [read for req_id in failed for read in self._reads.pop(req_id, ())]
        self.blocks_loaded -= len(forget)
        still_read = self._read_now()
        for key, source in forget:
            if source in still_read:
                continue
            if self._slots.get(key) == source:
                del self._slots[key]
                self._free_slots.append(source)  # type: ignore[arg-type]  # a slot
            elif self._disk.get(key) == source:
                del self._disk[key]
                self._disk_dropped.append(source)  # type: ignore[arg-type]  # a path

    def build_connector_meta(self, chunks: Sequence[ScheduledChunk]) -> BlockCopies:
        if self._disk_ranks and time.monotonic() >= self._next_reclaim:
            self._reclaim()
        copies = BlockCopies(to_device=self._to_device, from_disk=self._from_disk, disk_dropped=self._disk_dropped,
                             async_loads=self._async_loads)
        self._to_device, self._from_disk, self._disk_dropped, self._async_loads = [], [], [], {}
        loading = {slot for _, slot in copies.to_device} | {s for s in self._read_now() if isinstance(s, int)}
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
                # Taken: a slot this step stores into holds its old block until the
                # saves after the forward, so demoting it now would write the old one.
                loading.add(slot)
                self._slots[key] = slot
                copies.to_host.append((chunk.block_ids[index], slot))
                copies.stored_keys.append(key)
                self.blocks_stored += 1
        return copies

    def _take_slot(self, loading: set[int], copies: BlockCopies) -> int | None:
        """A free slot, else the least recently used one's (not one this step loads
        from or stores into: loads run first, but keeping them apart keeps the
        directory simple; a stored slot is written after the demotions),
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
            reading = self._read_now()
            victim = next((k for k, path in self._disk.items() if path not in reading), None)
            if victim is None:
                return  # every file is being read: the block is dropped, not demoted
            copies.disk_dropped.append(self._disk.pop(victim))
        name = disk_name(key)
        self._disk[key] = f"{self.instance_dir}/{name}{WRITTEN}"
        copies.to_disk.append((slot, name, self._disk[key]))
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
        demoted = {path for _, _, path in metadata.to_disk}  # type: ignore[attr-defined]
        for key in [key for key, path in self._disk.items() if path in demoted]:
            del self._disk[key]


class OffloadingWorker(KVConnectorWorker):
    """The CPU tier's tensors (one per cache tensor, [slots, block_size, ...]) and the
    block copies between them and the device cache."""

    def __init__(self, config: KVTransferConfig, block_size: int, rank: int, ops: OpDispatcher) -> None:
        super().__init__(config, block_size, rank, ops)
        self.host: list[tuple[torch.Tensor, ...]] = []
        disk_path = config.kv_connector_extra_config.get(DISK_PATH_KEY)
        #: This rank's root of the disk tier (None: no disk tier); the instance
        #: directories under it are the scheduler half's.
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

    def handshake_metadata(self) -> tuple[str, BlockLayout] | None:
        """The disk tier's root on this rank and its files' layout (None: no disk
        tier), for the scheduler half's lookups in other instances' directories."""
        if self.disk_root is None:
            return None
        return str(self.disk_root), block_layout(self._block_tensors(0))

    def _block_tensors(self, slot: int) -> dict[str, torch.Tensor]:
        """CPU slot `slot`'s block as a disk file holds it, by tensor name."""
        # Clones: safetensors refuses tensors that share one storage (the slot views).
        return {f"{layer}.{index}": stored[slot].clone() for layer, host in enumerate(self.host)
                for index, stored in enumerate(host)}

    @staticmethod
    def _indices(pairs: list[tuple[int, int]], device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
        blocks, slots = zip(*pairs)
        return torch.tensor(blocks, device=device), torch.tensor(slots)

    def _disk_file(self, path: str) -> Path:
        assert self.disk_root is not None, "a disk tier copy without a disk tier"
        return self.disk_root / path

    def _sync_disk(self, copies: BlockCopies) -> None:
        """The step's disk work, before its forward: disk hits read into their device
        blocks (first: a file this step deletes may be one it reads), evicted CPU
        slots written out (under a temporary name in the same directory, then
        renamed: a reader, of any instance, sees a whole file or none), dropped files
        deleted."""
        for block, path in copies.from_disk:
            tensors = load_file(str(self._disk_file(path)))
            for layer, cache in enumerate(self.kv_caches):
                for index, tensor in enumerate(cache):
                    stored = tensors[f"{layer}.{index}"]
                    if stored.dtype != tensor.dtype or stored.shape != tensor.shape[1:]:
                        raise ValueError(f"disk KV block {path} holds {stored.dtype} {tuple(stored.shape)}, this "
                                         f"cache {tensor.dtype} {tuple(tensor.shape[1:])}")
                    tensor[block] = stored.to(tensor.device)
        for slot, name, path in copies.to_disk:
            tensors = self._block_tensors(slot)
            file = self._disk_file(path)
            temporary = file.with_name(f".{file.name}.{os.getpid()}.tmp")
            save_file(tensors, str(temporary), metadata={KEY_FIELD: name})
            os.replace(temporary, file)
        for path in copies.disk_dropped:
            self._disk_file(path).unlink(missing_ok=True)

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
