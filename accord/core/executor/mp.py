"""The multiprocess executor: one spawned worker process per rank on this host, each
talking to the engine over its own pipe.

Failure behaviour: every wait also watches the workers' process sentinels, so a worker
that dies (killed, OOM, a crash in a kernel) turns the call in flight, and every later
one, into EngineDeadError instead of a hang; a monitor thread notices a death between
calls too. Start-up failures name the rank and the cause. Workers die with the engine:
they exit when their pipe closes and carry a parent-death signal; `shutdown` (also run
at interpreter exit) asks them to stop, then terminates and finally kills stragglers.
"""

from __future__ import annotations

import ctypes
import logging
import multiprocessing
import multiprocessing.connection
import os
import signal
import socket
import sys
import threading
import time
import weakref
from collections.abc import Mapping, Sequence
from typing import Any

import torch

from ..config import EngineConfig
from ..device import BackendFactory
from ..errors import EngineDeadError, WorkerError, WorkerStartupError
from .base import Executor
from .rpc import call_worker, error_reply, reply_error

logger = logging.getLogger("accord.executor")

#: Seconds the workers may take to start (join torch.distributed, load, report ready).
STARTUP_TIMEOUT_S = 600.0
#: Seconds the other ranks get to answer after one rank's method raised; a rank still
#: silent then is stuck (in a collective its failed peer never joined).
ERROR_GRACE_S = 30.0
#: Seconds a worker gets to stop by itself, then after SIGTERM, before SIGKILL.
STOP_TIMEOUT_S = 5.0

_SHUTDOWN = "__shutdown__"


class MultiprocExecutor(Executor):
    """Runs rank r's Worker in its own spawned process."""

    def __init__(self, config: EngineConfig, backend_factory: BackendFactory) -> None:
        super().__init__(config, backend_factory)
        context = multiprocessing.get_context("spawn")
        init_method = f"tcp://127.0.0.1:{_free_port()}"
        self._procs: list[multiprocessing.process.BaseProcess] = []
        self._conns: list[multiprocessing.connection.Connection] = []
        self._dead_reason: str | None = None
        self._stopping = False
        for rank in range(self.world_size):
            parent_end, child_end = context.Pipe()
            process = context.Process(
                target=_worker_main,
                args=(config, backend_factory, rank, self.world_size, init_method, child_end),
                name=f"accord-worker-{rank}",
                daemon=True,
            )
            process.start()
            child_end.close()
            self._procs.append(process)
            self._conns.append(parent_end)
        # A dead executor's survivors may be stuck in a collective: no grace for them.
        self._graceful_stop = {"graceful": True}
        self._finalizer = weakref.finalize(self, _stop_workers, self._procs, self._conns, self._graceful_stop)
        try:
            self._gather(timeout=STARTUP_TIMEOUT_S, starting=True)
        except BaseException:
            self.shutdown()
            raise
        self._monitor = threading.Thread(target=self._watch_workers, name="accord-worker-monitor", daemon=True)
        self._monitor.start()
        logger.info("started %d worker processes: %s", self.world_size, [p.pid for p in self._procs])

    @property
    def dead_reason(self) -> str | None:
        return self._dead_reason

    @property
    def worker_pids(self) -> list[int]:
        """Process ids of the workers, in rank order."""
        return [p.pid for p in self._procs if p.pid is not None]

    def collective_rpc(
        self, method: str, args: Sequence[Any] = (), kwargs: Mapping[str, Any] | None = None
    ) -> list[Any]:
        if self._dead_reason is not None:
            raise EngineDeadError(self._dead_reason)
        for rank, conn in enumerate(self._conns):
            try:
                conn.send((method, tuple(args), dict(kwargs or {})))
            except (BrokenPipeError, OSError) as error:
                raise self._die(f"worker rank {rank} cannot be reached ({error})") from error
        return self._gather(timeout=None)

    def _gather(self, timeout: float | None, starting: bool = False) -> list[Any]:
        """Every rank's reply, in rank order. Raises the first WorkerError once every
        rank has answered (or ERROR_GRACE_S passed), and EngineDeadError as soon as a
        worker process is gone."""
        results: list[Any] = [None] * self.world_size
        pending = dict(enumerate(self._conns))
        sentinels = {p.sentinel: rank for rank, p in enumerate(self._procs)}
        errors: list[WorkerError] = []
        deadline = None if timeout is None else time.monotonic() + timeout
        while pending:
            if errors and deadline is None:
                deadline = time.monotonic() + ERROR_GRACE_S
            remaining = None if deadline is None else max(0.0, deadline - time.monotonic())
            try:
                ready = multiprocessing.connection.wait([*pending.values(), *sentinels], timeout=remaining)
            except (OSError, ValueError) as error:  # the monitor closed the pipes meanwhile
                raise EngineDeadError(self._dead_reason or f"worker pipes closed ({error})") from error
            if not ready:
                silent = sorted(pending)
                cause = f"; {errors[0]}" if errors else ""
                raise self._die(f"worker ranks {silent} did not answer within {timeout or ERROR_GRACE_S:.0f} s{cause}")
            for rank, conn in list(pending.items()):
                if conn not in ready:
                    continue
                try:
                    reply = conn.recv()
                except (EOFError, OSError):
                    continue  # the process is gone: its sentinel says so below
                del pending[rank]
                error = reply_error(rank, reply)
                if error is None:
                    results[rank] = reply[1]
                else:
                    errors.append(error)
                    if starting:
                        logger.error("worker rank %d failed to start:\n%s", rank, reply[2])
                        raise WorkerStartupError(f"worker rank {rank} failed to start: {reply[1]}")
            for sentinel, rank in sentinels.items():
                if sentinel in ready:
                    self._procs[rank].join(0.5)
                    code = self._procs[rank].exitcode
                    if starting:
                        raise WorkerStartupError(
                            f"worker rank {rank} died while starting (exit code {code}; its output is above; a "
                            "script that starts workers needs an `if __name__ == '__main__':` guard)"
                        )
                    raise self._die(f"worker rank {rank} died (exit code {code})")
        if errors:
            raise errors[0]
        return results

    def _die(self, reason: str) -> EngineDeadError:
        """Record that the workers can no longer run, stop them, tell the engine."""
        first = self._dead_reason is None
        if first:
            self._dead_reason = reason
            logger.error("executor is dead: %s", reason)
        self._graceful_stop["graceful"] = False
        self.shutdown()
        if first and self.on_dead is not None:
            self.on_dead()
        return EngineDeadError(self._dead_reason)

    def _watch_workers(self) -> None:
        """Block until a worker process exits; unless shutting down, that is a death."""
        multiprocessing.connection.wait([p.sentinel for p in self._procs])
        if self._stopping:
            return
        for rank, process in enumerate(self._procs):
            process.join(0.5)
            if process.exitcode is not None:
                self._die(f"worker rank {rank} died (exit code {process.exitcode})")
                return

    def shutdown(self) -> None:
        self._stopping = True
        self._finalizer()  # first: a step in flight then fails fast on the closed workers
        self._stop_step_thread()


def _stop_workers(procs: list, conns: list, mode: dict) -> None:
    """Ask each worker to stop (when `mode["graceful"]`), then SIGTERM, then SIGKILL;
    close the pipes."""
    graceful = mode["graceful"]
    for conn in conns if graceful else ():
        try:
            conn.send((_SHUTDOWN, (), {}))
        except (BrokenPipeError, OSError):
            pass
    for process in procs:
        if graceful:
            process.join(STOP_TIMEOUT_S)
        if process.is_alive():
            process.terminate()
            process.join(STOP_TIMEOUT_S)
        if process.is_alive():
            process.kill()
            process.join()
    for conn in conns:
        conn.close()


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def _die_with_parent() -> None:
    """Linux: SIGKILL this process when the engine process dies, even mid-step."""
    if sys.platform.startswith("linux"):
        libc = ctypes.CDLL(None, use_errno=True)
        pr_set_pdeathsig = 1
        libc.prctl(pr_set_pdeathsig, signal.SIGKILL)


def _worker_main(
    config: EngineConfig,
    backend_factory: BackendFactory,
    rank: int,
    world_size: int,
    init_method: str,
    conn: multiprocessing.connection.Connection,
) -> None:
    """A worker process: build the Worker, report ready (or why not), then run the
    engine's calls until told to stop or the engine's end of the pipe closes."""
    from ..worker.worker import Worker  # imported here: the spawned process starts bare

    _die_with_parent()
    # Ctrl-C reaches the whole process group; the engine decides how to stop.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    # Ranks sharing a host share its cores (unless OMP_NUM_THREADS says otherwise).
    if "OMP_NUM_THREADS" not in os.environ:
        torch.set_num_threads(max(1, torch.get_num_threads() // world_size))
    try:
        worker = Worker(config, backend_factory, rank, world_size, init_method)
    except BaseException as error:  # noqa: BLE001 - the engine must hear why
        conn.send(error_reply(error))
        os._exit(1)
    conn.send(("ok", None))
    while True:
        try:
            method, args, kwargs = conn.recv()
        except (EOFError, OSError):
            break  # the engine is gone
        if method == _SHUTDOWN:
            break
        reply = call_worker(worker, method, args, kwargs)
        try:
            conn.send(reply)
        except (BrokenPipeError, OSError):
            break
    worker.shutdown()
