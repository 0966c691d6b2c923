"""The executor interface: create the workers for a config (TP x DP ranks, DP-major),
call a method on every worker and gather the per-rank results, shut down.

Under --async-scheduling steps run on a thread of their own (`execute_model_async`),
one after another, so the engine schedules the next step and processes the last one's
outputs meanwhile: the uni executor's torch ops release the GIL, and the mp and ray
executors wait on pipes or Ray futures.

An implementation provides `collective_rpc`, `shutdown` and `is_dead` semantics:
a worker that can no longer answer (its process died) raises EngineDeadError from
every later call and from the call in flight, never hangs it; a method that raises in
a worker raises WorkerError after every rank has answered. The mp (worker processes)
and ray (Ray actors) executors carry the same call protocol (`rpc`).
"""

from __future__ import annotations

import importlib
import threading
from abc import ABC, abstractmethod
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any

from ..config import EngineConfig
from ..device import BackendFactory
from ..errors import EngineDeadError
from ..sched.output import ModelRunnerOutput, SchedulerOutput


class StepSkipped(Exception):
    """A step was not run because the step before it failed: it reads tokens that step
    did not sample. The engine runs it again once it has dealt with the failure."""


#: Name prefix of the thread steps run on under async scheduling.
STEP_THREAD = "accord-step"

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
        #: Every rank of every data-parallel replica: TP size x DP size, DP-major.
        self.world_size = config.world_size
        #: Called (from any thread) once when the executor finds it can no longer run.
        self.on_dead: Callable[[], None] | None = None
        #: The thread steps run on under async scheduling (one: steps run in order).
        self._step_thread = (
            ThreadPoolExecutor(max_workers=1, thread_name_prefix=STEP_THREAD) if config.async_scheduling else None
        )

    @abstractmethod
    def collective_rpc(
        self, method: str, args: Sequence[Any] = (), kwargs: Mapping[str, Any] | None = None
    ) -> list[Any]:
        """Call `method(*args, **kwargs)` on every worker; their results in rank order."""

    @abstractmethod
    def shutdown(self) -> None:
        """Stop every worker; safe to call more than once. Implementations end with
        `_stop_step_thread`."""

    def _stop_step_thread(self) -> None:
        """Stop the step thread once the step it runs ends (without waiting when called
        on that thread: a step that found the workers dead shuts the executor down)."""
        if self._step_thread is not None:
            on_it = threading.current_thread().name.startswith(STEP_THREAD)
            self._step_thread.shutdown(wait=not on_it, cancel_futures=True)

    @property
    def dead_reason(self) -> str | None:
        """Why the executor can no longer run (None while it can)."""
        return None

    def execute_model(self, steps: list[SchedulerOutput]) -> list[ModelRunnerOutput | None]:
        """Run one step on every rank, `steps[d]` on data-parallel replica d's ranks;
        each replica's driver results (None for a replica with nothing to compute).
        Every rank is sent its step before any reply is awaited (`collective_rpc`), so
        no replica waits in an expert-parallel collective for one not yet started."""
        return self.collective_rpc("execute_model", (steps,))[:: self.config.tensor_parallel_size]

    def execute_model_async(
        self, steps: list[SchedulerOutput], after: Future[Any] | None = None
    ) -> Future[list[ModelRunnerOutput | None]]:
        """`execute_model` as a future, run after `after` (the step in flight, whose
        sampled tokens this one computes; if it failed, this step is not run and its
        future raises StepSkipped). Under async scheduling the step thread runs it;
        otherwise it runs now, in the caller's thread, and the future is done."""
        if self.dead_reason is not None:
            raise EngineDeadError(self.dead_reason)  # the step thread has stopped with the workers
        if self._step_thread is not None:
            return self._step_thread.submit(self._execute_after, steps, after)
        future: Future[list[ModelRunnerOutput | None]] = Future()
        try:
            future.set_result(self._execute_after(steps, after))
        except Exception as error:  # noqa: BLE001 - the future carries it to the engine
            future.set_exception(error)
        return future

    def _execute_after(self, steps: list[SchedulerOutput], after: Future[Any] | None) -> list[ModelRunnerOutput | None]:
        """Run `steps` unless `after` (done by now: steps run in order) failed."""
        if after is not None and after.exception() is not None:
            raise StepSkipped("the step before it failed")
        return self.execute_model(steps)

    def execute_subset(self, req_ids: list[str]) -> ModelRunnerOutput:
        """Re-run the last step for some of its requests on every rank (one
        data-parallel replica: the engine isolates failures only there)."""
        return self.collective_rpc("execute_subset", (req_ids,))[0]


def executor_class(name: str) -> type[Executor]:
    """The executor class of a `distributed_executor_backend` name."""
    if name not in EXECUTORS:
        raise ValueError(f"unknown distributed_executor_backend {name!r}; use one of {list(EXECUTORS)}")
    module, _, attribute = EXECUTORS[name].partition(":")
    return getattr(importlib.import_module(module), attribute)
