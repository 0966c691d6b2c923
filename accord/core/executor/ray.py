"""The Ray executor: one Ray actor per rank, so one deployment spans the nodes of a Ray
cluster (`--distributed-executor-backend ray`, install with `pip install 'accord[ray]'`).

Where it runs: attached to the cluster `RAY_ADDRESS` names, else on a local cluster it
starts (and stops) itself; in a process that is already connected to Ray it uses that
connection. Placement: one placement group per tensor-parallel group, one bundle per
rank, STRICT_PACK, so every TP group sits on one node while DP groups may spread. The
ranks meet for torch.distributed at the driver rank's node IP and a free port there.

Failure behaviour matches mp: every wait watches each actor (a call parked on a
"monitor" thread of each actor resolves only when the actor dies), so a dead actor
turns the call in flight, and every later one, into EngineDeadError instead of a hang,
and a death between calls is noticed too. Ray itself is imported only when this
executor is built: accord imports without it.
"""

from __future__ import annotations

import logging
import os
import socket
import threading
import time
import weakref
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import torch

from ..config import EngineConfig
from ..device import BackendFactory
from ..errors import EngineDeadError, WorkerError, WorkerStartupError
from .base import Executor
from .mp import ERROR_GRACE_S, STARTUP_TIMEOUT_S, STOP_TIMEOUT_S
from .rpc import Reply, call_worker, error_reply, reply_error

logger = logging.getLogger("accord.executor")

#: Seconds the cluster gets to reserve the placement groups; longer means it lacks the
#: resources (it may be autoscaling, but a deployment that waits silently looks hung).
PLACEMENT_TIMEOUT_S = 120.0
#: How often a wait for replies looks up from Ray to see whether the executor died.
POLL_S = 1.0
#: The Ray resource one rank reserves, by the torch device type of its backend; any
#: other device (a CPU) reserves one CPU.
DEVICE_RESOURCES = {"cuda": "GPU", "npu": "NPU"}
#: Environment variables handed to the actors (an attached cluster's nodes do not have
#: the engine's environment): accord's settings, the communicators' interface choices,
#: Triton's interpreter switch, and an explicit thread count.
FORWARDED_ENV_PREFIXES = ("ACCORD_", "GLOO_", "NCCL_", "HCCL_", "TRITON_", "OMP_NUM_THREADS")
INSTALL_HINT = "pip install 'accord[ray]'"
#: Serialises stopping (the monitor thread and the engine's thread may both get there).
_STOP_LOCK = threading.Lock()


def import_ray() -> Any:
    """The `ray` module, or an ImportError that says how to install it."""
    try:
        import ray
    except ImportError as error:
        raise ImportError(f"--distributed-executor-backend ray needs Ray: {INSTALL_HINT}") from error
    return ray


@dataclass(frozen=True)
class ActorPlacement:
    """Where one rank's actor landed."""

    node_id: str
    node_ip: str
    pid: int


class RayWorkerActor:
    """The actor body: hosts one rank's Worker and answers the engine's calls with the
    shared reply protocol. Made a Ray actor class by `RayExecutor` (Ray is imported
    lazily)."""

    def __init__(self) -> None:
        self.worker: Any = None
        self._forever = threading.Event()

    def placement(self) -> ActorPlacement:
        """The node this actor runs on and its process id."""
        import ray

        return ActorPlacement(ray.get_runtime_context().get_node_id(), ray.util.get_node_ip_address(), os.getpid())

    def rendezvous_address(self) -> str:
        """A torch.distributed init address on this actor's node: its IP and a port that
        is free there now."""
        import ray

        with socket.socket() as sock:
            sock.bind(("", 0))
            port = sock.getsockname()[1]
        return f"tcp://{ray.util.get_node_ip_address()}:{port}"

    def start(
        self,
        config: EngineConfig,
        backend_factory: BackendFactory,
        rank: int,
        world_size: int,
        init_method: str | None,
        ranks_on_node: int | None,
    ) -> Reply:
        """Build the Worker for `rank` (joining torch.distributed and loading its shard).
        Ranks sharing a node share its cores (`ranks_on_node`; None when the engine's
        OMP_NUM_THREADS decides): Ray would hold each actor to one thread."""
        from ..worker.worker import Worker

        if ranks_on_node is not None:
            torch.set_num_threads(max(1, (os.cpu_count() or 1) // ranks_on_node))
        try:
            self.worker = Worker(config, backend_factory, rank, world_size, init_method)
        except BaseException as error:  # noqa: BLE001 - the engine must hear why
            return error_reply(error)
        return ("ok", None)

    def execute(self, method: str, args: Sequence[Any], kwargs: Mapping[str, Any]) -> Reply:
        """Run one engine call on the Worker."""
        return call_worker(self.worker, method, args, kwargs)

    def stop(self) -> None:
        """Leave the torch.distributed world."""
        if self.worker is not None:
            self.worker.shutdown()

    def wait_until_dead(self) -> None:
        """Never returns: its result resolves (as an actor error) only when the actor dies.
        Runs on the actor's "monitor" thread, beside the calls."""
        self._forever.wait()


class RayExecutor(Executor):
    """Runs rank r's Worker in a Ray actor placed in its TP group's placement group."""

    def __init__(self, config: EngineConfig, backend_factory: BackendFactory) -> None:
        super().__init__(config, backend_factory)
        ray = self._ray = import_ray()
        from ray.util.placement_group import placement_group
        from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

        self._dead_reason: str | None = None
        self._stopping = False
        tp_size = config.tensor_parallel_size
        resource = DEVICE_RESOURCES.get(backend_factory().device().type, "CPU")
        self._actors: list[Any] = []
        self._placement_groups: list[Any] = []
        self._monitors: dict[Any, int] = {}
        self._state = {"graceful": True}
        self._finalizer = weakref.finalize(
            self, _stop_actors, ray, self._actors, self._placement_groups, self._state, _connect(ray, self.world_size)
        )
        try:
            self._placement_groups += [
                placement_group(
                    [{resource: 1.0}] * tp_size, strategy="STRICT_PACK", name=f"accord-tp-group-{start // tp_size}"
                )
                for start in range(0, self.world_size, tp_size)
            ]
            self._reserve(resource)
            actor_class = ray.remote(concurrency_groups={"monitor": 1})(RayWorkerActor)
            env_vars = {name: value for name, value in os.environ.items() if name.startswith(FORWARDED_ENV_PREFIXES)}
            for rank in range(self.world_size):
                strategy = PlacementGroupSchedulingStrategy(
                    self._placement_groups[rank // tp_size], placement_group_bundle_index=rank % tp_size
                )
                self._actors.append(
                    actor_class.options(
                        num_cpus=1.0 if resource == "CPU" else 0.0,
                        resources=None if resource == "CPU" else {resource: 1.0},
                        scheduling_strategy=strategy,
                        runtime_env={"env_vars": env_vars} if env_vars else None,
                    ).remote()
                )
            self._monitors = {
                actor.wait_until_dead.options(concurrency_group="monitor").remote(): rank
                for rank, actor in enumerate(self._actors)
            }
            self.placements: list[ActorPlacement] = self._gather(
                [actor.placement.remote() for actor in self._actors], STARTUP_TIMEOUT_S, starting=True, raw=True
            )
            init_method = None
            if self.world_size > 1:
                rendezvous = self._actors[0].rendezvous_address.remote()
                init_method = self._gather([rendezvous], STARTUP_TIMEOUT_S, starting=True, raw=True)[0]
            ranks_on_node = [sum(p.node_id == mine.node_id for p in self.placements) for mine in self.placements]
            if "OMP_NUM_THREADS" in os.environ:
                ranks_on_node = [None] * self.world_size
            self._gather(
                [
                    actor.start.remote(config, backend_factory, rank, self.world_size, init_method, ranks_on_node[rank])
                    for rank, actor in enumerate(self._actors)
                ],
                STARTUP_TIMEOUT_S,
                starting=True,
            )
        except BaseException:
            self._state["graceful"] = False
            self.shutdown()
            raise
        self._monitor = threading.Thread(target=self._watch_actors, name="accord-ray-monitor", daemon=True)
        self._monitor.start()
        nodes = sorted({p.node_ip for p in self.placements})
        logger.info(
            "started %d Ray worker actors (pids %s) on node(s) %s, rendezvous %s",
            self.world_size, self.worker_pids, nodes, init_method,
        )

    @property
    def dead_reason(self) -> str | None:
        return self._dead_reason

    @property
    def worker_pids(self) -> list[int]:
        """Process ids of the worker actors, in rank order (on their own nodes)."""
        return [placement.pid for placement in self.placements]

    def collective_rpc(
        self, method: str, args: Sequence[Any] = (), kwargs: Mapping[str, Any] | None = None
    ) -> list[Any]:
        if self._dead_reason is not None:
            raise EngineDeadError(self._dead_reason)
        call = (method, tuple(args), dict(kwargs or {}))
        return self._gather([actor.execute.remote(*call) for actor in self._actors], timeout=None)

    def _reserve(self, resource: str) -> None:
        """Wait until the cluster has reserved every placement group, or say what is missing."""
        ready, _ = self._ray.wait(
            [group.ready() for group in self._placement_groups],
            num_returns=len(self._placement_groups),
            timeout=PLACEMENT_TIMEOUT_S,
        )
        if len(ready) < len(self._placement_groups):
            tp_size = self.config.tensor_parallel_size
            raise WorkerStartupError(
                f"the Ray cluster could not place {len(self._placement_groups)} group(s) of {tp_size} x {{{resource}: 1}} "
                f"(each group on one node) within {PLACEMENT_TIMEOUT_S:.0f} s; it has {self._ray.cluster_resources()}"
            )

    def _gather(self, refs: list[Any], timeout: float | None, starting: bool = False, raw: bool = False) -> list[Any]:
        """Every rank's result, in rank order (`raw`: the values themselves, else
        replies). Raises the first WorkerError once every rank has answered (or
        ERROR_GRACE_S passed), and EngineDeadError as soon as an actor is dead."""
        ray = self._ray
        results: list[Any] = [None] * len(refs)
        pending = {ref: rank for rank, ref in enumerate(refs)}
        errors: list[WorkerError] = []
        deadline = None if timeout is None else time.monotonic() + timeout
        while pending:
            if self._dead_reason is not None and not starting:
                raise EngineDeadError(self._dead_reason)
            if errors and deadline is None:
                deadline = time.monotonic() + ERROR_GRACE_S
            if deadline is not None and time.monotonic() >= deadline:
                cause = f"; {errors[0]}" if errors else ""
                silent = sorted(pending.values())
                reason = f"worker ranks {silent} did not answer within {timeout or ERROR_GRACE_S:.0f} s{cause}"
                if starting:
                    raise WorkerStartupError(reason)
                raise self._die(reason)
            wait_s = POLL_S if deadline is None else max(0.0, min(POLL_S, deadline - time.monotonic()))
            ready, _ = ray.wait([*pending, *self._monitors], num_returns=1, timeout=wait_s)
            for ref in ready:
                if ref in self._monitors:
                    rank = self._monitors[ref]
                    cause = _death_cause(ray, ref)
                    if starting:
                        raise WorkerStartupError(f"worker rank {rank} died while starting ({cause})")
                    raise self._die(f"worker rank {rank} died ({cause})")
                rank = pending.pop(ref)
                try:
                    value = ray.get(ref)
                except ray.exceptions.RayActorError as error:
                    if starting:
                        raise WorkerStartupError(f"worker rank {rank} died while starting ({error})") from error
                    raise self._die(f"worker rank {rank} died ({type(error).__name__})") from error
                if raw:
                    results[rank] = value
                    continue
                error = reply_error(rank, value)
                if error is None:
                    results[rank] = value[1]
                    continue
                if starting:
                    logger.error("worker rank %d failed to start:\n%s", rank, error.traceback_text)
                    raise WorkerStartupError(f"worker rank {rank} failed to start: {value[1]}")
                errors.append(error)
        if errors:
            raise errors[0]
        return results

    def _die(self, reason: str) -> EngineDeadError:
        """Record that the workers can no longer run, kill them, tell the engine. The
        Ray connection stays until `shutdown`: other threads may still be waiting on it."""
        first = self._dead_reason is None
        if first:
            self._dead_reason = reason
            logger.error("executor is dead: %s", reason)
        # The survivors may be stuck in a collective their dead peer never joins.
        self._state["graceful"] = False
        _stop_actors(self._ray, self._actors, self._placement_groups, self._state, disconnect=False)
        if first and self.on_dead is not None:
            self.on_dead()
        return EngineDeadError(self._dead_reason)

    def _watch_actors(self) -> None:
        """Block until an actor dies; unless shutting down, that is the executor's death."""
        ray = self._ray
        try:
            ready, _ = ray.wait(list(self._monitors), num_returns=1, timeout=None)
        except Exception:  # noqa: BLE001 - Ray itself went away (shutdown at exit)
            return
        if self._stopping or not ready:
            return
        rank = self._monitors[ready[0]]
        self._die(f"worker rank {rank} died ({_death_cause(ray, ready[0])})")

    def shutdown(self) -> None:
        self._stopping = True
        self._finalizer()  # first: a step in flight then fails fast on the closed workers
        self._stop_step_thread()


def _connect(ray: Any, world_size: int) -> bool:
    """Connect this process to Ray unless it is already: the cluster RAY_ADDRESS names,
    else a new local one sized for the world. Returns whether this call connected (the
    executor then disconnects at shutdown, which stops a local cluster)."""
    if ray.is_initialized():
        return False
    # Ray's usage reporting would try to reach the internet from every deployment.
    os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
    quiet = {"logging_level": logging.WARNING, "log_to_driver": True}
    address = os.environ.get("RAY_ADDRESS")
    if address:
        logger.info("attaching to the Ray cluster at %s", address)
        ray.init(address=address, **quiet)
    else:
        logger.info("starting a local Ray cluster for %d rank(s) (set RAY_ADDRESS to use a running one)", world_size)
        ray.init(address="local", num_cpus=world_size, include_dashboard=False, **quiet)
    return True


def _death_cause(ray: Any, monitor_ref: Any) -> str:
    """What Ray says about a dead actor, from its monitor call's error."""
    try:
        ray.get(monitor_ref, timeout=0)
    except Exception as error:  # noqa: BLE001 - the cause is the error itself
        first_line = str(error).strip().splitlines()
        return f"{type(error).__name__}: {first_line[0]}" if first_line else type(error).__name__
    return "its monitor call returned"


def _stop_actors(ray: Any, actors: list, groups: list, state: dict, disconnect: bool) -> None:
    """Ask each worker to leave torch.distributed (when `state["graceful"]`), kill the
    actors, free the placement groups, and disconnect from Ray when this executor
    connected (stopping a local cluster it started)."""
    with _STOP_LOCK:
        if ray.is_initialized():
            _release(ray, actors, groups, state["graceful"])
        if disconnect and ray.is_initialized():
            ray.shutdown()


def _release(ray: Any, actors: list, groups: list, graceful: bool) -> None:
    """Stop (gracefully first when asked) and kill the actors, remove the groups."""
    from ray.util.placement_group import remove_placement_group

    if graceful and actors:
        try:
            ray.wait([actor.stop.remote() for actor in actors], num_returns=len(actors), timeout=STOP_TIMEOUT_S)
        except Exception:  # noqa: BLE001 - stopping anyway
            pass
    for actor in actors:
        try:
            ray.kill(actor, no_restart=True)
        except Exception:  # noqa: BLE001 - already gone
            pass
    for group in groups:
        try:
            remove_placement_group(group)
        except Exception:  # noqa: BLE001 - already removed
            pass
    actors.clear()
    groups.clear()
