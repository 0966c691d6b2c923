"""The KV connectors accord has, by vLLM's names: each name's scheduler and worker
halves, imported only when chosen (a network connector's transfer engine is a heavy,
optional dependency)."""

from __future__ import annotations

from importlib import import_module
from typing import TYPE_CHECKING

from .config import KVTransferConfig

if TYPE_CHECKING:
    from ...op_contracts import OpDispatcher
    from .base import KVConnectorScheduler, KVConnectorWorker

#: Connector name -> (module, scheduler half, worker half).
CONNECTORS: dict[str, tuple[str, str, str]] = {
    "SharedStorageConnector": ("accord.core.kv_transfer.shared_storage", "SharedStorageScheduler", "SharedStorageWorker"),
    "OffloadingConnector": ("accord.core.kv_transfer.offload", "OffloadingScheduler", "OffloadingWorker"),
    "NixlConnector": ("accord.core.kv_transfer.nixl", "NixlScheduler", "NixlWorker"),
}


def check_connector(config: KVTransferConfig) -> tuple[str, str, str]:
    """The module and halves of the connector `config` names; ValueError (naming those
    accord has) for one it does not have. Imports nothing."""
    entry = CONNECTORS.get(config.kv_connector)
    if entry is None:
        raise ValueError(f"Unsupported kv_connector: {config.kv_connector}. Supported: {sorted(CONNECTORS)}")
    return entry


def _halves(config: KVTransferConfig) -> tuple[type[KVConnectorScheduler], type[KVConnectorWorker]]:
    module_name, scheduler_half, worker_half = check_connector(config)
    module = import_module(module_name)
    return getattr(module, scheduler_half), getattr(module, worker_half)


def make_scheduler_connector(config: KVTransferConfig, block_size: int, bytes_per_block: int) -> KVConnectorScheduler:
    """The scheduler half of the connector `config` names, for a cache of blocks of
    `block_size` tokens costing `bytes_per_block` bytes (on one rank)."""
    return _halves(config)[0](config, block_size, bytes_per_block)


def make_worker_connector(
    config: KVTransferConfig, block_size: int, rank: int, ops: OpDispatcher
) -> KVConnectorWorker:
    """Rank `rank`'s worker half of the connector `config` names, moving KV with `ops`."""
    return _halves(config)[1](config, block_size, rank, ops)
