"""The device facts core needs of a backend, as a protocol: core is handed an object
with these (a `Backend` from accord.backends has them) and never imports a backend.

A `BackendFactory` is how a caller hands one over: a picklable, zero-argument callable
returning the backend, so a worker process can build its own.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Protocol

import torch

from ..op_contracts.dispatcher import KernelProvider


class DeviceBackend(KernelProvider, Protocol):
    """What the engine, runner and workers read of a backend."""

    def device(self) -> torch.device: ...

    def fp8_dtype(self) -> torch.dtype: ...

    def compute_dtype(self, requested: torch.dtype) -> torch.dtype: ...

    def memory_info(self) -> tuple[int, int]: ...

    def kv_cache_shape(self, num_blocks: int, block_size: int, num_kv_heads: int, head_size: int) -> tuple[int, ...]: ...

    def supported_block_sizes(self) -> tuple[int, ...] | None: ...

    def device_count(self) -> int | None: ...

    def synchronize(self) -> None: ...

    #: Whether graph_capture records a real (replayable without the host) graph.
    captures_graphs: bool
    #: The largest decode batch the backend captures (None: no limit of its own).
    max_graph_batch: int | None

    def graph_capture(self, fn: Callable[[], torch.Tensor]) -> Callable[[], torch.Tensor]: ...


#: Builds the backend in whichever process calls it; must pickle (workers are spawned).
BackendFactory = Callable[[], DeviceBackend]
