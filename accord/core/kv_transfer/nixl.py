"""`NixlConnector` (vLLM's name): prompt KV read from the prefill instance's cache over
NIXL (UCX: TCP, shared memory or RDMA, whatever UCX finds), the multi-node path.

Prefill side (`kv_producer`/`kv_both`): each rank's worker half registers its cache
with its NIXL agent once, whose listener (`kv_port` + rank) serves the agent's
metadata. A request sent with `kv_transfer_params: {"do_remote_decode": true}` keeps
its blocks when it finishes (`keeps_blocks`) and returns params naming the agent, its
host and port, the block ids and the cache's layout and spec. The blocks are freed when
the decode side's NIXL notification says it has read them, or after
`kv_connector_extra_config.abort_timeout_s` (vLLM's 480 s by default) if it never does.

Decode side (`kv_consumer`/`kv_both`): a request carrying such params loads all its
prompt tokens but the last. The worker half fetches the remote agent's metadata from
its listener (NIXL's own, once per remote agent), READs the request's remote blocks
straight into its own blocks when both caches have one spec (dtype, block size), or
else into a registered staging buffer and through `kv_convert` into its blocks (as
SharedStorageConnector converts), and notifies the prefill side. A request that ends
without its remote KV having been read (aborted while it waited, or its prompt computed
here) sends the same notification with its first step after (vLLM's empty-block recv), so
the prefill side frees the blocks now, not at its timeout; a request reads its remote KV
once, so one preempted after the read recomputes what it lost. A prefill instance whose
listener does not answer is found out before any block is allocated for the load,
and the prompt is computed here; one that dies between that check and the read fails
that request cleanly (finish_reason "error").

Reads are synchronous within the step, as every accord connector's are; one rank per
instance (tensor parallelism would need a rank-to-rank block split).
"""

from __future__ import annotations

import logging
import socket
import time
import uuid
from collections.abc import Callable, Collection, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch

from ...op_contracts import OpDispatcher
from .base import (
    BlockTransfer,
    KVConnectorMetadata,
    KVConnectorScheduler,
    KVConnectorWorker,
    ScheduledChunk,
    TransferRequest,
)
from .config import KVTransferConfig
from .nixl_layout import NixlKVLayout, RemoteKV, RemoteTensor

logger = logging.getLogger("accord.kv_transfer")

#: Seconds a prefill instance keeps a finished request's blocks for a reader that never
#: notifies (vLLM's VLLM_NIXL_ABORT_REQUEST_TIMEOUT default).
DEFAULT_ABORT_TIMEOUT_S = 480.0
#: Seconds the decode side waits for a remote agent's metadata, and for one read.
DEFAULT_TRANSFER_TIMEOUT_S = 10.0


def _extra_seconds(config: KVTransferConfig, key: str, default: float) -> float:
    value = float(config.kv_connector_extra_config.get(key, default))
    if value <= 0:
        raise ValueError(f"NixlConnector: kv_connector_extra_config.{key} must be > 0, got {value}")
    return value


def listener_answers(host: str, port: int, timeout: float = 1.0) -> bool:
    """Whether something accepts TCP connections at host:port (the remote agent's
    metadata listener); a connection is opened and closed, nothing is sent."""
    try:
        with socket.create_connection((host, port), timeout=timeout):
            return True
    except OSError:
        return False


@dataclass(frozen=True)
class NixlLoad(BlockTransfer):
    """A load of tokens [start, end) into `block_ids`, from the remote blocks `remote`
    describes."""

    remote: RemoteKV


@dataclass
class NixlMetadata(KVConnectorMetadata):
    """A step's loads, and the remote KV of requests that ended unread, whose prefill
    instances are told to free it (a step with nothing to compute carries these too)."""

    releases: list[RemoteKV] = field(default_factory=list)

    def __bool__(self) -> bool:
        return bool(self.releases) or super().__bool__()


class NixlScheduler(KVConnectorScheduler):
    """Keeps prefilled requests' blocks for their reader; plans reads of remote ones."""

    def __init__(
        self, config: KVTransferConfig, block_size: int, bytes_per_block: int, clock: Callable[[], float] = time.monotonic
    ) -> None:
        super().__init__(config, block_size, bytes_per_block)
        self.abort_timeout_s = _extra_seconds(config, "abort_timeout_s", DEFAULT_ABORT_TIMEOUT_S)
        self._clock = clock
        self._layout: NixlKVLayout | None = None
        self._loads: list[BlockTransfer] = []
        #: Requests to hand on whose prompt is computed, by id -> their block ids.
        self._prefilled: dict[str, tuple[int, ...]] = {}
        #: Finished requests whose blocks wait for their reader, by id -> deadline.
        self._kept: dict[str, float] = {}
        #: Unfinished requests whose remote KV a load was planned for (read once: the
        #: prefill side frees it after the read).
        self._reads_planned: set[str] = set()
        #: Remote KV of requests that finished unread, for the next step's workers to release.
        self._releases: list[RemoteKV] = []

    def set_worker_metadata(self, metadata: Sequence[Any]) -> None:
        if len(metadata) != 1:
            raise ValueError(f"NixlConnector supports one rank per instance, this one has {len(metadata)}")
        super().set_worker_metadata(metadata)
        self._layout = metadata[0]

    def _remote(self, request: TransferRequest) -> RemoteKV | None:
        """The remote KV `request`'s params name, if this instance should read it."""
        params = request.kv_transfer_params or {}
        if not self.config.is_consumer or not params.get("do_remote_prefill") or request.req_id in self._reads_planned:
            return None
        try:
            remote = RemoteKV.from_params(params)
        except ValueError as error:
            logger.warning("%s: %s; computing the prompt here", request.req_id, error)
            return None
        if remote.num_tokens != len(request.prompt_token_ids):
            logger.warning("%s: the remote KV covers %d tokens, the prompt has %d; computing the prompt here",
                           request.req_id, remote.num_tokens, len(request.prompt_token_ids))
            return None
        return remote

    def get_num_new_matched_tokens(self, request: TransferRequest, num_computed_tokens: int) -> tuple[int, bool]:
        # Synchronous: a read notifies the prefill instance as it ends, inside the step.
        remote = self._remote(request)
        if remote is None:
            return 0, False
        if not listener_answers(remote.layout.host, remote.layout.port):
            logger.warning("%s: the prefill instance's NIXL listener %s:%d does not answer; computing the prompt here",
                           request.req_id, remote.layout.host, remote.layout.port)
            return 0, False
        return max(0, len(request.prompt_token_ids) - 1 - num_computed_tokens), False

    def update_state_after_alloc(
        self, request: TransferRequest, block_ids: Sequence[int], num_computed_tokens: int, num_external_tokens: int
    ) -> None:
        remote = self._remote(request) if num_external_tokens > 0 else None
        if remote is not None:
            self._reads_planned.add(request.req_id)
            self._loads.append(NixlLoad(
                request.req_id, remote.request_id, tuple(block_ids),
                num_computed_tokens, num_computed_tokens + num_external_tokens, remote,
            ))

    def build_connector_meta(self, chunks: Sequence[ScheduledChunk]) -> KVConnectorMetadata:
        metadata = NixlMetadata(loads=self._loads, releases=self._releases)
        self._loads, self._releases = [], []
        if self.config.is_producer:
            for chunk in chunks:
                request, num_prompt = chunk.request, len(chunk.request.prompt_token_ids)
                wants_handover = (request.kv_transfer_params or {}).get("do_remote_decode")
                if wants_handover and chunk.num_computed_tokens < num_prompt <= chunk.num_computed_tokens + chunk.num_new_tokens:
                    self._prefilled[request.req_id] = tuple(chunk.block_ids)
        return metadata

    def has_pending_metadata(self) -> bool:
        return bool(self._releases)

    def request_finished(self, request: TransferRequest) -> dict[str, Any] | None:
        self._release_if_unread(request)
        block_ids = self._prefilled.pop(request.req_id, None)
        # An aborted or failed request hands nothing on: nobody continues it, and a
        # failed step may have left its blocks unwritten.
        if block_ids is None or self._layout is None or request.finish_reason in ("abort", "error"):
            return None
        self._kept[request.req_id] = self._clock() + self.abort_timeout_s
        num_tokens = len(request.prompt_token_ids)
        blocks = block_ids[: -(-num_tokens // self.block_size)]
        return RemoteKV(self._layout, blocks, request.req_id, num_tokens).to_params()

    def _release_if_unread(self, request: TransferRequest) -> None:
        """A decode-side request that ends without having read the remote KV its params
        name: queue the release notification (its prefill instance would otherwise hold
        the blocks until abort_timeout_s)."""
        if request.req_id in self._reads_planned:
            self._reads_planned.discard(request.req_id)
            return
        params = request.kv_transfer_params or {}
        if not self.config.is_consumer or not params.get("do_remote_prefill"):
            return
        try:
            self._releases.append(RemoteKV.from_params(params))
        except ValueError:
            return  # garbled params name no blocks to release

    def keeps_blocks(self, req_id: str) -> bool:
        return req_id in self._kept

    def blocks_to_free(self, finished_sending: Collection[str]) -> set[str]:
        now = self._clock()
        expired = {req_id for req_id, deadline in self._kept.items() if deadline <= now}
        for req_id in expired - set(finished_sending):
            logger.warning("%s: no decode instance read its KV within %.0f s; freeing its blocks",
                           req_id, self.abort_timeout_s)
        done = expired | (set(finished_sending) & self._kept.keys())
        for req_id in done:
            del self._kept[req_id]
        return done


def _nixl_api() -> Any:
    """NIXL's Python API: the `nixl` package's, or the `nixl-cu12` wheel's (which runs
    on a CPU host too); ImportError says what to install."""
    for module in ("nixl._api", "nixl_cu12._api"):
        try:
            return __import__(module, fromlist=["nixl_agent"])
        except ImportError:
            continue
    raise ImportError("NixlConnector needs NIXL: pip install --no-deps nixl-cu12 (or accord[nixl]); see docs/disaggregation.md")


class NixlWorker(KVConnectorWorker):
    """Registers this rank's cache with a NIXL agent and reads remote blocks into it."""

    def __init__(self, config: KVTransferConfig, block_size: int, rank: int, ops: OpDispatcher) -> None:
        super().__init__(config, block_size, rank, ops)
        self.timeout_s = _extra_seconds(config, "transfer_timeout_s", DEFAULT_TRANSFER_TIMEOUT_S)
        api = _nixl_api()
        self.port = config.kv_port + rank
        self.agent_name = f"{config.engine_id or uuid.uuid4().hex[:12]}-rank{rank}"
        # The listener serves this agent's metadata and takes the replies to its own fetches.
        self.agent = api.nixl_agent(
            self.agent_name,
            api.nixl_agent_config(enable_listen_thread=True, listen_port=self.port, backends=["UCX"]),
        )
        #: Remote agents whose metadata this agent holds.
        self._remote_agents: set[str] = set()

    def register_kv_caches(self, kv_caches: list[tuple[torch.Tensor, ...]]) -> None:
        super().register_kv_caches(kv_caches)
        tensors = [tensor for cache in kv_caches for tensor in cache]
        if not all(tensor.is_contiguous() for tensor in tensors):
            raise ValueError("NixlConnector: the KV cache tensors must be contiguous to be registered")
        self.agent.register_memory(self.agent.get_reg_descs(tensors))

    def handshake_metadata(self) -> NixlKVLayout:
        tensors = [tensor for cache in self.kv_caches for tensor in cache]
        return NixlKVLayout(
            agent_name=self.agent_name,
            host=self.config.kv_ip,
            port=self.port,
            block_size=self.block_size,
            dtype=str(tensors[0].dtype),
            tensors=tuple(RemoteTensor(tensor.data_ptr(), tuple(tensor.shape[2:])) for tensor in tensors),
        )

    def finished_sending(self) -> set[str]:
        return {message.decode() for messages in self.agent.get_new_notifs().values() for message in messages}

    def start_load_kv(self, metadata: KVConnectorMetadata) -> None:
        assert isinstance(metadata, NixlMetadata)
        for remote in metadata.releases:
            self._release(remote)
        for load in metadata.loads:
            assert isinstance(load, NixlLoad)
            try:
                self._load(load)
            finally:
                self._notify(load.remote)

    def _load(self, load: NixlLoad) -> None:
        """Read `load`'s remote blocks and write its tokens into this cache."""
        layout = load.remote.layout
        local = [tensor for cache in self.kv_caches for tensor in cache]
        shapes = [tensor.shape[2:] for tensor in local]
        if [tuple(shape) for shape in shapes] != [tensor.token_shape for tensor in layout.tensors]:
            raise ValueError(f"the remote KV of {load.req_id} has another KV layout (per-token shapes) than this cache")
        self._connect(layout)
        # The remote blocks holding tokens [start, end), read whole.
        first, last = load.start // layout.block_size, (load.end - 1) // layout.block_size
        remote_blocks = load.remote.block_ids[first : last + 1]
        if layout.block_size == self.block_size and all(tensor.dtype == layout.torch_dtype for tensor in local):
            # The same spec (vLLM's only case): straight into this request's blocks.
            self._read(layout, remote_blocks, local, load.block_ids[first : last + 1])
            return
        staging = [
            torch.empty((len(remote_blocks), layout.block_size, *tensor.token_shape), dtype=layout.torch_dtype)
            for tensor in layout.tensors
        ]
        registered = self.agent.register_memory(self.agent.get_reg_descs(staging))
        try:
            self._read(layout, remote_blocks, staging, range(len(remote_blocks)))
        finally:
            self.agent.deregister_memory(registered)
        device = local[0].device
        rows = torch.arange(load.start - first * layout.block_size, load.end - first * layout.block_size, device=device)
        slots = load.slots(self.block_size).to(device)
        for source, cache in zip(staging, local):
            self.convert_into(source.to(device), cache, rows, slots)

    def _connect(self, layout: NixlKVLayout) -> None:
        """Fetch the remote agent's metadata from its listener, once."""
        if layout.agent_name in self._remote_agents:
            return
        self.agent.fetch_remote_metadata(layout.agent_name, layout.host, layout.port)
        deadline = time.monotonic() + self.timeout_s
        while not self.agent.check_remote_metadata(layout.agent_name):
            if time.monotonic() > deadline:
                raise RuntimeError(f"NixlConnector: no metadata from agent {layout.agent_name} at "
                                   f"{layout.host}:{layout.port} within {self.timeout_s:.0f} s")
            time.sleep(0.001)
        self._remote_agents.add(layout.agent_name)

    def _read(
        self, layout: NixlKVLayout, remote_blocks: Sequence[int], targets: list[torch.Tensor], target_blocks: Sequence[int]
    ) -> None:
        """One NIXL READ of `remote_blocks` of every remote tensor into `target_blocks` of
        the matching registered tensor of `targets` (blocks of the remote's size)."""
        local_descs, remote_descs = [], []
        for tensor, target in zip(layout.tensors, targets):
            size = layout.bytes_per_block(tensor)
            for block, target_block in zip(remote_blocks, target_blocks):
                local_descs.append((target.data_ptr() + target_block * size, size, 0))
                remote_descs.append((tensor.address + block * size, size, 0))
        handle = self.agent.initialize_xfer(
            "READ", self.agent.get_xfer_descs(local_descs, "DRAM"),
            self.agent.get_xfer_descs(remote_descs, "DRAM"), layout.agent_name,
        )
        try:
            state = self.agent.transfer(handle)
            deadline = time.monotonic() + self.timeout_s
            while state == "PROC" and time.monotonic() < deadline:
                time.sleep(0.0005)
                state = self.agent.check_xfer_state(handle)
            if state != "DONE":
                # A failed or stuck read: drop the agent, so the next load fetches it anew.
                self._remote_agents.discard(layout.agent_name)
                raise RuntimeError(f"NixlConnector: the READ from {layout.agent_name} ended in state {state}")
        finally:
            self.agent.release_xfer_handle(handle)

    def _release(self, remote: RemoteKV) -> None:
        """Tell the prefill instance that no read of `remote` will come (best effort,
        never raising: a side that is gone, or does not answer, frees by its timeout)."""
        layout = remote.layout
        if layout.agent_name not in self._remote_agents:
            if not listener_answers(layout.host, layout.port):
                logger.info("%s: the prefill instance's listener %s:%d does not answer; not releasing its blocks",
                            remote.request_id, layout.host, layout.port)
                return
            try:
                self._connect(layout)
            except RuntimeError as error:
                logger.warning("%s: could not release its blocks: %s", remote.request_id, error)
                return
        self._notify(remote)

    def _notify(self, remote: RemoteKV) -> None:
        """Tell the prefill instance its blocks for `remote` may be freed, read or not
        (best effort: a side that is gone frees them by its timeout)."""
        if remote.layout.agent_name not in self._remote_agents:
            return
        try:
            self.agent.send_notif(remote.layout.agent_name, remote.request_id.encode())
        except Exception as error:  # noqa: BLE001 - NIXL raises its own types; the timeout covers it
            logger.warning("could not notify %s that %s was read: %s", remote.layout.agent_name, remote.request_id, error)

    def wait_for_layer_load(self, layer: int) -> None:
        """Reads are synchronous: done when start_load_kv returns."""

    def save_kv_layer(self, layer: int, metadata: KVConnectorMetadata) -> None:
        """Nothing to save: the decode side reads the kept blocks."""

    def wait_for_save(self) -> None:
        """Nothing to wait for: no saves."""
