"""`SharedStorageConnector` (vLLM's name): KV saved to and loaded from files under one
directory (`kv_connector_extra_config.shared_storage_path`) that every instance on a
host, or a shared file system, can read. For tests, and for one box with two device
pools; the multi-node path belongs on a transfer engine.

A request's prompt KV is saved once its prompt is computed, as one safetensors file
per rank, `<path>/<key>/rank<r>.safetensors`, where the key is the SHA-256 of the
prompt's token ids: an instance with the same prompt finds it without being told, and
a client cannot name another prompt's KV (the key a client sends back in
kv_transfer_params is checked against the one computed here). A file is written under
a temporary name and renamed, so a reader never sees half of one. Saves run inside
the step, on the step's own blocks; loads run on the worker's reader thread while the
steps go on (base.py), or inside the admitting step with `async_load` false or
several ranks.

A file holds the KV in the producer's spec (its cache dtype, one token per row). A
load goes through the backend's `kv_convert` op into this instance's cache, so a
producer and a consumer whose cache dtypes or block sizes differ (a bf16 cache on one
side, fp32 or fp8 on the other) still hand a prompt over; the per-token shape (heads
and head size, or MLA's latent width) must agree, since that is the model's, not the
cache's. accord's fp8 caches are written with scale 1.0, so both scales are 1.0.
"""

from __future__ import annotations

import hashlib
import logging
import os
from array import array
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch
from safetensors import safe_open
from safetensors.torch import save_file

from .base import (
    BlockTransfer,
    KVConnectorMetadata,
    KVConnectorScheduler,
    KVConnectorWorker,
    ScheduledChunk,
    TransferRequest,
)
from ...op_contracts import OpDispatcher
from .config import KVTransferConfig

logger = logging.getLogger("accord.kv_transfer")

#: The safetensors metadata key holding how many tokens a file's tensors cover.
NUM_TOKENS_KEY = "num_tokens"


def prompt_key(token_ids: Sequence[int]) -> str:
    """The store's name for a prompt's KV: SHA-256 of its token ids as int64."""
    return hashlib.sha256(array("q", token_ids).tobytes()).hexdigest()


def storage_path(config: KVTransferConfig) -> Path:
    """The directory `kv_connector_extra_config.shared_storage_path` names (required)."""
    path = config.kv_connector_extra_config.get("shared_storage_path")
    if not path:
        raise ValueError("SharedStorageConnector needs kv_connector_extra_config.shared_storage_path")
    return Path(path)


def _file(root: Path, key: str, rank: int) -> Path:
    return root / key / f"rank{rank}.safetensors"


def _tensor_name(layer: int, index: int) -> str:
    return f"layer{layer}.{index}"


class SharedStorageScheduler(KVConnectorScheduler):
    """Finds saved prompts on disk and plans each step's file loads and saves."""

    def __init__(self, config: KVTransferConfig, block_size: int, bytes_per_block: int) -> None:
        super().__init__(config, block_size, bytes_per_block)
        self.root = storage_path(config)
        self.root.mkdir(parents=True, exist_ok=True)
        self._loads: list[BlockTransfer] = []
        #: Requests whose prompt this instance saved (or plans to), by id -> key.
        self._saved: dict[str, str] = {}

    def _stored_tokens(self, key: str) -> int:
        """Tokens the store holds for `key` (0: none)."""
        path = _file(self.root, key, 0)
        if not path.is_file():
            return 0
        with safe_open(str(path), framework="pt") as stored:
            return int((stored.metadata() or {}).get(NUM_TOKENS_KEY, 0))

    def get_num_new_matched_tokens(self, request: TransferRequest, num_computed_tokens: int) -> tuple[int, bool]:
        params = request.kv_transfer_params or {}
        if not self.config.is_consumer or params.get("do_remote_decode"):
            return 0, False  # a prefill request computes its prompt here
        key = prompt_key(request.prompt_token_ids)
        sent_key = params.get("remote_storage_key")
        if sent_key is not None and sent_key != key:
            logger.warning("%s: kv_transfer_params name KV of another prompt; computing the prompt here", request.req_id)
            return 0, False
        stored = self._stored_tokens(key)
        if stored == 0 and params.get("do_remote_prefill"):
            logger.warning("%s: the prefill instance's KV is not in %s; computing the prompt here", request.req_id, self.root)
        loadable = min(stored, len(request.prompt_token_ids) - 1)
        return max(0, loadable - num_computed_tokens), self.loads_async

    def update_state_after_alloc(
        self, request: TransferRequest, block_ids: Sequence[int], num_computed_tokens: int, num_external_tokens: int
    ) -> None:
        if num_external_tokens > 0:
            self._loads.append(BlockTransfer(
                request.req_id, prompt_key(request.prompt_token_ids), tuple(block_ids),
                num_computed_tokens, num_computed_tokens + num_external_tokens,
            ))

    def build_connector_meta(self, chunks: Sequence[ScheduledChunk]) -> KVConnectorMetadata:
        if self.loads_async:
            # Files are written whole under a temporary name: a reader thread may read one
            # while a step saves another.
            metadata = KVConnectorMetadata(async_loads={
                load.req_id: KVConnectorMetadata(loads=[load]) for load in self._loads
            })
        else:
            metadata = KVConnectorMetadata(loads=self._loads)
        self._loads = []
        if not self.config.is_producer:
            return metadata
        for chunk in chunks:
            request, num_prompt = chunk.request, len(chunk.request.prompt_token_ids)
            # Saved once, by the step that computes the prompt's last token.
            if chunk.num_computed_tokens < num_prompt <= chunk.num_computed_tokens + chunk.num_new_tokens:
                key = prompt_key(request.prompt_token_ids)
                self._saved[request.req_id] = key
                if self._stored_tokens(key) < num_prompt:
                    metadata.saves.append(BlockTransfer(request.req_id, key, tuple(chunk.block_ids), 0, num_prompt))
        return metadata

    def request_finished(self, request: TransferRequest) -> dict[str, Any] | None:
        key = self._saved.pop(request.req_id, None)
        if key is None:
            return None
        # vLLM's keys for "the decode instance loads this prompt's KV".
        return {
            "do_remote_prefill": True,
            "do_remote_decode": False,
            "remote_storage_key": key,
            "remote_num_tokens": len(request.prompt_token_ids),
        }


class SharedStorageWorker(KVConnectorWorker):
    """Copies tokens' KV between this rank's cache and the files, by slot."""

    def __init__(self, config: KVTransferConfig, block_size: int, rank: int, ops: OpDispatcher) -> None:
        super().__init__(config, block_size, rank, ops)
        self.root = storage_path(config)
        self._pending: dict[str, dict[str, torch.Tensor]] = {}

    def _flat(self, tensor: torch.Tensor) -> torch.Tensor:
        # [num_blocks, block_size, ...] -> [slots, ...]: a view, so writes land in the cache.
        return tensor.view(-1, *tensor.shape[2:])

    def start_load_kv(self, metadata: KVConnectorMetadata) -> None:
        for load in metadata.loads:
            path = _file(self.root, load.key, self.rank)
            device = self.kv_caches[0][0].device
            slots = load.slots(self.block_size).to(device)
            rows = torch.arange(load.end - load.start, device=device)
            with safe_open(str(path), framework="pt") as stored:
                for layer, cache in enumerate(self.kv_caches):
                    for index, tensor in enumerate(cache):
                        name = _tensor_name(layer, index)
                        if name not in stored.keys():
                            raise ValueError(f"{path} holds no {name}: it was saved by a model with another KV layout")
                        part = stored.get_slice(name)[load.start : load.end]
                        if tuple(part.shape[1:]) != tuple(tensor.shape[2:]):
                            raise ValueError(
                                f"{path}: {name} is {tuple(part.shape[1:])} per token, this cache "
                                f"{tuple(tensor.shape[2:])}: it was saved by a model with another KV layout"
                            )
                        # The file's tokens [tokens, ...] as blocks of one token.
                        self.convert_into(part.to(device).unsqueeze(1), tensor, rows, slots)

    def wait_for_layer_load(self, layer: int) -> None:
        """Loads are synchronous: done when start_load_kv returns."""

    def save_kv_layer(self, layer: int, metadata: KVConnectorMetadata) -> None:
        for save in metadata.saves:
            slots = save.slots(self.block_size).to(self.kv_caches[layer][0].device)
            tensors = self._pending.setdefault(save.key, {})
            for index, tensor in enumerate(self.kv_caches[layer]):
                tensors[_tensor_name(layer, index)] = self._flat(tensor)[slots].cpu()

    def wait_for_save(self) -> None:
        for key, tensors in self._pending.items():
            path = _file(self.root, key, self.rank)
            path.parent.mkdir(parents=True, exist_ok=True)
            num_tokens = next(iter(tensors.values())).shape[0]
            temporary = path.with_name(f".{path.name}.{os.getpid()}.tmp")
            save_file(tensors, str(temporary), metadata={NUM_TOKENS_KEY: str(num_tokens)})
            os.replace(temporary, path)
        self._pending = {}
