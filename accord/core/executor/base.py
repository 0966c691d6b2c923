"""The executor interface: create the workers for a config, call a method on every
worker and gather the per-rank results, shut down.

An implementation provides `collective_rpc`, `shutdown` and `is_dead` semantics:
a worker that can no longer answer (its process died) raises EngineDeadError from
every later call and from the call in flight, never hangs it; a method that raises in
a worker raises WorkerError after every rank has answered. The mp (worker processes)
and ray (Ray actors) executors carry the same call protocol (`rpc`).
"""

from __future__ import annotations

import importlib
from abc import ABC, abstractmethod
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from ..config import EngineConfig
from ..device import BackendFactory
from ..sched.output import ModelRunnerOutput, SchedulerOutput

#: Executor implementations by `distributed_executor_backend` name.
EXECUTORS = {
    "uni": "accord.core.executor.uni:UniProcExecutor",
    "mp": "accord.core.executor.mp:MultiprocExecutor",
    "ray": "accord.core.executor.ray:RayExecutor",
}


class Executor(ABC):
    """Runs one worker per rank and calls methods on all of them."""

    def __init__(self, config: EngineConfig, backend_factory: BackendFactory) -> None:
        self.config = config
        self.backend_factory = backend_factory
        self.world_size = config.tensor_parallel_size
        #: Called (from any thread) once when the executor finds it can no longer run.
        self.on_dead: Callable[[], None] | None = None

    @abstractmethod
    def collective_rpc(
        self, method: str, args: Sequence[Any] = (), kwargs: Mapping[str, Any] | None = None
    ) -> list[Any]:
        """Call `method(*args, **kwargs)` on every worker; their results in rank order."""

    @abstractmethod
    def shutdown(self) -> None:
        """Stop every worker; safe to call more than once."""

    @property
    def dead_reason(self) -> str | None:
        """Why the executor can no longer run (None while it can)."""
        return None

    def execute_model(self, step: SchedulerOutput) -> ModelRunnerOutput:
        """Run one step on every rank; the driver rank's results."""
        return self.collective_rpc("execute_model", (step,))[0]

    def execute_subset(self, req_ids: list[str]) -> ModelRunnerOutput:
        """Re-run the last step for some of its requests on every rank."""
        return self.collective_rpc("execute_subset", (req_ids,))[0]


def executor_class(name: str) -> type[Executor]:
    """The executor class of a `distributed_executor_backend` name."""
    if name not in EXECUTORS:
        raise ValueError(f"unknown distributed_executor_backend {name!r}; use one of {list(EXECUTORS)}")
    module, _, attribute = EXECUTORS[name].partition(":")
    return getattr(importlib.import_module(module), attribute)
