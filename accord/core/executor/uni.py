"""The in-process executor: one worker, called directly (one rank, today's behaviour).

Under --async-scheduling the steps run one after another on a worker thread of their
own (torch releases the GIL inside its ops), so the engine schedules the next step and
processes the last one's outputs while this one computes."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any

from ..config import EngineConfig
from ..device import BackendFactory
from ..sched.output import ModelRunnerOutput, SchedulerOutput
from ..worker import Worker
from .base import Executor


class UniProcExecutor(Executor):
    """Runs the single worker in this process."""

    def __init__(self, config: EngineConfig, backend_factory: BackendFactory) -> None:
        super().__init__(config, backend_factory)
        if self.world_size != 1:
            raise ValueError(f"the uni executor runs one rank, not {self.world_size}; use 'mp'")
        self.driver_worker = Worker(config, backend_factory)
        #: The thread steps run on under async scheduling (one: steps run in order).
        self._step_thread = (
            ThreadPoolExecutor(max_workers=1, thread_name_prefix="accord-step") if config.async_scheduling else None
        )

    def collective_rpc(
        self, method: str, args: Sequence[Any] = (), kwargs: Mapping[str, Any] | None = None
    ) -> list[Any]:
        return [getattr(self.driver_worker, method)(*args, **(kwargs or {}))]

    def execute_model_async(
        self, steps: list[SchedulerOutput], after: Future[Any] | None = None
    ) -> Future[list[ModelRunnerOutput | None]]:
        if self._step_thread is None:
            return super().execute_model_async(steps, after)
        return self._step_thread.submit(self._execute_after, steps, after)

    def shutdown(self) -> None:
        if self._step_thread is not None:
            self._step_thread.shutdown(wait=True)
        self.driver_worker.shutdown()
