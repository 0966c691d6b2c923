"""The in-process executor: one worker, called directly (one rank, today's behaviour)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from ..config import EngineConfig
from ..device import BackendFactory
from ..worker.worker import Worker
from .base import Executor


class UniProcExecutor(Executor):
    """Runs the single worker in this process."""

    def __init__(self, config: EngineConfig, backend_factory: BackendFactory) -> None:
        super().__init__(config, backend_factory)
        if self.world_size != 1:
            raise ValueError(f"the uni executor runs one rank, not {self.world_size}; use 'mp'")
        self.driver_worker = Worker(config, backend_factory)

    def collective_rpc(
        self, method: str, args: Sequence[Any] = (), kwargs: Mapping[str, Any] | None = None
    ) -> list[Any]:
        return [getattr(self.driver_worker, method)(*args, **(kwargs or {}))]

    def shutdown(self) -> None:
        self._stop_step_thread()
        self.driver_worker.shutdown()
