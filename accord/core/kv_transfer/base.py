"""The KV connector interface, in the shape vLLM v1 settled on
(vllm/distributed/kv_transfer/kv_connector/v1/base.py): one connector, two halves.

The scheduler half decides: how many of a waiting request's tokens an external source
holds beyond the local prefix cache (`get_num_new_matched_tokens`), what to load once
blocks are allocated for them (`update_state_after_alloc`), what each step loads and
saves (`build_connector_meta`, plain data that travels in the `SchedulerOutput`), and
what a finished request tells its caller (`request_finished`: the kv_transfer_params
a decode instance needs). The worker half moves the bytes: `start_load_kv` before the
forward, `wait_for_layer_load` per layer, `save_kv_layer` per layer after it and
`wait_for_save` before the step's results go back, so a block is never freed (and
reused) while a save still reads it.

Both halves see requests as `TransferRequest`s (plain data), never the scheduler's
Request, and caches as each layer's tensors in the backend's declared layout.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Collection, Sequence
from dataclasses import dataclass, field
from typing import Any, Hashable

import torch

from ...op_contracts import OpDispatcher
from .config import KVTransferConfig

#: One layer's cache as the runner holds it: (key, value) for GQA, (latent,) for MLA,
#: each [num_blocks, block_size, ...] (the contracts' layout).
LayerCache = tuple[torch.Tensor, ...]


@dataclass(frozen=True)
class TransferRequest:
    """What a connector knows of a request: its id, prompt, kv_transfer_params, known
    token count, (for connectors that read them) its full blocks' prefix-cache keys,
    the block manager's hash chain, and once it finished, why (stop, length, abort,
    error)."""

    req_id: str
    prompt_token_ids: Sequence[int]
    kv_transfer_params: dict[str, Any] | None = None
    num_tokens: int = 0
    block_keys: tuple[Hashable, ...] = ()
    finish_reason: str | None = None


@dataclass(frozen=True)
class BlockTransfer:
    """Tokens [start, end) of one request, held in `block_ids` (its block table from
    token 0), to be moved between this engine's cache and the connector's store under
    `key`."""

    req_id: str
    key: str
    block_ids: tuple[int, ...]
    start: int
    end: int

    def slots(self, block_size: int) -> torch.Tensor:
        """The flat cache slots (block * block_size + offset) of tokens [start, end)."""
        positions = torch.arange(self.start, self.end)
        blocks = torch.tensor(self.block_ids, dtype=torch.int64)[positions // block_size]
        return blocks * block_size + positions % block_size


@dataclass
class KVConnectorMetadata:
    """One step's transfers, built by the scheduler half and run by the worker half:
    loads happen before the step's forward, saves after it."""

    loads: list[BlockTransfer] = field(default_factory=list)
    saves: list[BlockTransfer] = field(default_factory=list)

    def __bool__(self) -> bool:
        return bool(self.loads or self.saves)

    def requests_loading(self) -> set[str]:
        """The requests whose KV this step loads (a failed load fails them)."""
        return {load.req_id for load in self.loads}


@dataclass(frozen=True)
class ScheduledChunk:
    """A request's part of a step, as the scheduler half sees it: the tokens it had
    computed before the step, how many the step computes, and its block table."""

    request: TransferRequest
    block_ids: Sequence[int]
    num_computed_tokens: int
    num_new_tokens: int


class KVConnectorScheduler(ABC):
    """The scheduler's half of a connector: which tokens come from outside, and what
    each step moves."""

    #: Whether the scheduler hands this connector each request's block keys (hashing
    #: costs; only a block-keyed store needs them).
    uses_block_keys = False

    def __init__(self, config: KVTransferConfig, block_size: int, bytes_per_block: int) -> None:
        self.config = config
        self.block_size = block_size
        self.bytes_per_block = bytes_per_block

    @abstractmethod
    def get_num_new_matched_tokens(self, request: TransferRequest, num_computed_tokens: int) -> int:
        """Tokens past the `num_computed_tokens` the local prefix cache holds that the
        external store can provide (0: none). Never all of them: the last token is
        always computed, its logits sample the next."""

    @abstractmethod
    def update_state_after_alloc(
        self, request: TransferRequest, block_ids: Sequence[int], num_computed_tokens: int, num_external_tokens: int
    ) -> None:
        """Blocks are allocated for `request`: plan loading its `num_external_tokens`
        tokens after the `num_computed_tokens` local ones into them this step."""

    @abstractmethod
    def build_connector_meta(self, chunks: Sequence[ScheduledChunk]) -> KVConnectorMetadata:
        """This step's loads (those planned since the last call) and saves."""

    @abstractmethod
    def request_finished(self, request: TransferRequest) -> dict[str, Any] | None:
        """`request` finished: forget it, and return the kv_transfer_params its caller
        hands to the instance that continues it (None: nothing to hand on)."""

    def step_failed(self, metadata: KVConnectorMetadata) -> None:
        """The step that carried `metadata` raised: its saves did not happen (the
        engine re-runs its requests without them), so nothing may count on them."""

    def set_worker_metadata(self, metadata: Sequence[Any]) -> None:
        """What each rank's worker half published once its cache was registered
        (`KVConnectorWorker.handshake_metadata`, by rank), for the kv_transfer_params
        this half returns (vLLM's handshake metadata). Ignored unless a connector needs it."""

    def has_pending_metadata(self) -> bool:
        """Whether the next `build_connector_meta` carries work even when no request is
        scheduled (a notification for the workers to send), so the engine steps once
        more with nothing to compute."""
        return False

    def keeps_blocks(self, req_id: str) -> bool:
        """Asked right after `request_finished`: whether the finished request's blocks
        stay allocated (a remote instance still reads them) until `blocks_to_free`
        names it (vLLM's delay_free_blocks)."""
        return False

    def blocks_to_free(self, finished_sending: Collection[str]) -> set[str]:
        """Of the requests whose blocks this half kept, those to free now: the ones
        the workers report read (`finished_sending`) and any this half gives up on."""
        return set()

    def holds(self, key: Hashable) -> bool:
        """Whether the store holds the block of prefix-cache key `key`, so a request
        preempted with it loads it back instead of recomputing it (False unless a
        block-keyed store says otherwise)."""
        return False


class KVConnectorWorker(ABC):
    """The worker's half of a connector: moves KV between this rank's cache and the
    connector's store, through the backend's ops (`kv_convert` where the store holds
    KV of another spec than this cache's)."""

    def __init__(self, config: KVTransferConfig, block_size: int, rank: int, ops: OpDispatcher) -> None:
        self.config = config
        self.block_size = block_size
        self.rank = rank
        self.ops = ops
        self.kv_caches: list[LayerCache] = []
        #: Requests whose load failed in the last step (their blocks hold no valid KV),
        #: with the error's text.
        self.failed_loads: dict[str, str] = {}

    def register_kv_caches(self, kv_caches: list[LayerCache]) -> None:
        """The rank's cache, once allocated; a layout other than the contracts'
        [num_blocks, block_size, ...] is refused (slots would not address tokens)."""
        for layer, cache in enumerate(kv_caches):
            for tensor in cache:
                if tensor.dim() < 3 or tensor.shape[1] != self.block_size:
                    raise ValueError(
                        f"KV connector {self.config.kv_connector}: layer {layer}'s cache has shape "
                        f"{tuple(tensor.shape)}, not [num_blocks, {self.block_size}, ...]"
                    )
        self.kv_caches = kv_caches

    def convert_into(self, source: torch.Tensor, cache: torch.Tensor, rows: torch.Tensor, slots: torch.Tensor) -> None:
        """Write the tokens `rows` of `source` [blocks, block_size, ...] (its tokens in
        order, in the store's spec) into `cache`'s `slots`, in the cache's spec: the
        backend's kv_convert over both seen as [blocks, block_size, width]."""
        width = cache[0, 0].numel()
        self.ops.kv_convert(source.reshape(source.shape[0], source.shape[1], width),
                            cache.view(cache.shape[0], cache.shape[1], width), rows, slots)

    def handshake_metadata(self) -> Any:
        """Plain data the scheduler half needs of this rank once its cache is
        registered (None: nothing), handed to `set_worker_metadata`."""
        return None

    def get_finished(self) -> set[str]:
        """Requests whose kept blocks a remote instance finished reading since the last
        call (vLLM's finished_sending); polled every step, empty ones included."""
        return set()

    @abstractmethod
    def start_load_kv(self, metadata: KVConnectorMetadata) -> None:
        """Begin this step's loads into the registered cache."""

    @abstractmethod
    def wait_for_layer_load(self, layer: int) -> None:
        """Return once layer `layer`'s loads are in the cache."""

    @abstractmethod
    def save_kv_layer(self, layer: int, metadata: KVConnectorMetadata) -> None:
        """Begin saving this step's tokens of layer `layer` (its KV is written)."""

    @abstractmethod
    def wait_for_save(self) -> None:
        """Return once every save begun this step is complete."""

    def run_step(self, metadata: KVConnectorMetadata, forward: Any) -> Any:
        """Run `forward()` between this step's loads and saves. accord's model forward
        has no per-layer hook, so every layer's load is waited for before it and every
        layer is saved after it (no overlap of transfer and compute yet)."""
        self.failed_loads = {}
        try:
            self.start_load_kv(metadata)
            for layer in range(len(self.kv_caches)):
                self.wait_for_layer_load(layer)
        except Exception as error:
            self.failed_loads = dict.fromkeys(metadata.requests_loading(), f"{type(error).__name__}: {error}")
            raise
        result = forward()
        for layer in range(len(self.kv_caches)):
            self.save_kv_layer(layer, metadata)
        self.wait_for_save()
        return result
