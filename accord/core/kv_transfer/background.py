"""Loads that run off the step path (vLLM's async KV load): the worker half hands each
request's load to one reader thread and the steps go on; `poll` reports the loads that
ended since the last poll, done or failed, for the step's output (finished_recving).

One thread: the loads of a rank share one cache and one store, and running them in
order keeps a store's reads simple; the steps run beside it. A load writes only its
request's blocks, which no step computes until the scheduler has heard it finished.
"""

from __future__ import annotations

from collections.abc import Callable
from concurrent.futures import FIRST_COMPLETED, Future, ThreadPoolExecutor, wait

import torch


class BackgroundLoads:
    """The loads a worker half started in the background, by request id."""

    def __init__(self) -> None:
        self._thread: ThreadPoolExecutor | None = None
        self._pending: dict[str, Future[None]] = {}

    def __bool__(self) -> bool:
        return bool(self._pending)

    def start(self, req_id: str, load: Callable[[], None]) -> None:
        """Run `load()` (it writes `req_id`'s KV into the cache) on the reader thread."""
        if req_id in self._pending:
            raise ValueError(f"{req_id}: a KV load is already running for it")
        if self._thread is None:
            self._thread = ThreadPoolExecutor(1, thread_name_prefix="accord-kv-load")
        self._pending[req_id] = self._thread.submit(_without_grad, load)

    def wait_any(self, timeout_s: float) -> None:
        """Wait up to `timeout_s` for a load to end (at once with none running): a step
        with nothing to compute waits here, not in a spin, while loads run."""
        if self._pending:
            wait(self._pending.values(), timeout=timeout_s, return_when=FIRST_COMPLETED)

    def poll(self) -> tuple[set[str], dict[str, str]]:
        """The loads that ended since the last poll: those done, and those failed with
        the error's text (their blocks hold no valid KV)."""
        done: set[str] = set()
        failed: dict[str, str] = {}
        for req_id, future in list(self._pending.items()):
            if not future.done():
                continue
            del self._pending[req_id]
            error = future.exception()
            if error is None:
                done.add(req_id)
            else:
                failed[req_id] = f"{type(error).__name__}: {error}"
        return done, failed


def _without_grad(load: Callable[[], None]) -> None:
    # Grad mode is per thread: the reader thread's copies into the cache record no graph.
    with torch.inference_mode():
        load()
