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

A load is synchronous (in the admitting step, before its forward) or asynchronous, as
the scheduler half says in `get_num_new_matched_tokens`'s answer (vLLM's load_async).
An asynchronous one travels in the metadata's `async_loads`, one metadata per request:
the worker half runs it on a reader thread (background.py) while the steps go on, and
reports it in `get_finished`'s finished_recving (or in `get_load_errors`); the
scheduler keeps the request out of the steps until then (WAITING_FOR_REMOTE_KVS), and
tells the scheduler half (`loads_finished`), which keeps what the load reads (a CPU
slot, a file) in place until it has heard.

Both halves see requests as `TransferRequest`s (plain data), never the scheduler's
Request, and caches as each layer's tensors in the backend's declared layout.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Collection, Sequence
from dataclasses import dataclass, field
from functools import partial
from typing import Any, Hashable

import torch

from ...op_contracts import OpDispatcher
from .background import BackgroundLoads
from .config import KVTransferConfig, async_load

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
    #: Loads that run off the step path, by request: each one's own metadata, run by the
    #: worker half's `start_load_kv` on its reader thread.
    async_loads: dict[str, KVConnectorMetadata] = field(default_factory=dict)

    def __bool__(self) -> bool:
        return bool(self.loads or self.saves or self.async_loads)

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
        #: The ranks whose worker halves move this instance's KV (set_worker_metadata).
        self.num_ranks = 1

    @abstractmethod
    def get_num_new_matched_tokens(self, request: TransferRequest, num_computed_tokens: int) -> tuple[int, bool]:
        """Tokens past the `num_computed_tokens` the local prefix cache holds that the
        external store can provide (0: none), and whether they load asynchronously
        (vLLM's load_async: off the step path, the request waiting meanwhile). Never all
        of them: the last token is always computed, its logits sample the next."""

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
        this half returns (vLLM's handshake metadata). Overrides call this first."""
        self.num_ranks = len(metadata)

    @property
    def loads_async(self) -> bool:
        """Whether this connector's loads may run off the step path: unless the config
        turns them off (`async_load`), and with one rank, since a step's output is the
        driver rank's alone and could not say when every rank's load ended."""
        return async_load(self.config) and self.num_ranks == 1

    def loads_finished(self, finished: Collection[str], failed: Collection[str]) -> None:
        """The asynchronous loads of these requests ended (`failed`: their KV did not
        arrive), aborted requests' included: what they read may be reused now."""

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
        #: The asynchronous loads running on the reader thread, and those that failed
        #: since `get_load_errors` last gave them.
        self.background = BackgroundLoads()
        self._load_errors: dict[str, str] = {}

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

    def get_finished(self) -> tuple[set[str], set[str]]:
        """Polled every step, empty ones included (vLLM's get_finished): the requests
        whose kept blocks a remote instance finished reading since the last call
        (finished_sending), and those whose asynchronous load is in the cache
        (finished_recving; a failed one is in `get_load_errors` instead)."""
        done, failed = self.background.poll()
        self._load_errors.update(failed)
        return self.finished_sending(), done

    def get_load_errors(self) -> dict[str, str]:
        """The asynchronous loads that failed since the last call, with the error's
        text (vLLM's get_block_ids_with_load_errors, by request): their requests
        compute those tokens instead."""
        errors, self._load_errors = self._load_errors, {}
        return errors

    def finished_sending(self) -> set[str]:
        """Requests whose kept blocks a remote instance finished reading since the last
        call (none unless a connector keeps blocks for remote readers)."""
        return set()

    def wait_for_loads(self, timeout_s: float) -> None:
        """Wait up to `timeout_s` for an asynchronous load to end (a step with nothing
        to compute, so the engine polls without spinning); at once when none runs."""
        self.background.wait_any(timeout_s)

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
        """Start this step's asynchronous loads, then run `forward()` between its
        synchronous loads and its saves. accord's model forward has no per-layer hook,
        so every layer's load is waited for before it and every layer is saved after it
        (no overlap of a step's own transfers and compute yet)."""
        self.failed_loads = {}
        for req_id, load in metadata.async_loads.items():
            self.background.start(req_id, partial(self._run_loads, load))
        try:
            self._run_loads(metadata)
        except Exception as error:
            self.failed_loads = dict.fromkeys(metadata.requests_loading(), f"{type(error).__name__}: {error}")
            raise
        result = forward()
        for layer in range(len(self.kv_caches)):
            self.save_kv_layer(layer, metadata)
        self.wait_for_save()
        return result

    def _run_loads(self, metadata: KVConnectorMetadata) -> None:
        """Run `metadata`'s loads into the cache and wait for every layer's."""
        self.start_load_kv(metadata)
        for layer in range(len(self.kv_caches)):
            self.wait_for_layer_load(layer)
