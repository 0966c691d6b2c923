"""The parallel process layout: which rank this process is, its tensor-parallel group,
its data-parallel rank, the expert-parallel group, and the communicators the parallel
layers reduce, gather and exchange tokens through.

Ranks are laid out data-parallel-major: global rank = dp_rank * tp_size + tp_rank, so a
tensor-parallel group is `tp_size` consecutive ranks (kept on one node). With expert
parallelism the routed experts are split over the whole world (EP size = TP x DP, as in
vLLM), whose communicator is `ep_communicator`.

A worker calls `init_parallel` once (torch.distributed with the backend's communicator)
and hands the resulting `ParallelContext` to `load_model`; one rank uses
`ParallelContext.single()` and touches no torch.distributed at all.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import timedelta

import torch.distributed as dist

from .communicator import Communicator, CommunicatorProvider

#: How long a collective waits for its peers before it raises instead of hanging (a
#: peer that died or is stuck): longer than any legitimate skew between ranks entering
#: one collective (a first-call kernel compile on one rank, say).
COLLECTIVE_TIMEOUT = timedelta(minutes=10)


@dataclass(frozen=True)
class ParallelContext:
    """Where this process sits: global rank and world size, its tensor-parallel rank and
    group size, the communicator over that group (None for a single rank), its
    data-parallel rank and size, whether routed experts are split across the
    expert-parallel group instead of sliced, and the communicator over that group (the
    whole world; None without expert parallelism or with one rank)."""

    rank: int = 0
    world_size: int = 1
    tp_rank: int = 0
    tp_size: int = 1
    communicator: Communicator | None = None
    expert_parallel: bool = False
    dp_rank: int = 0
    dp_size: int = 1
    ep_communicator: Communicator | None = None

    @property
    def ep_size(self) -> int:
        """Ranks the routed experts are split over: TP size x DP size as in vLLM, or 1
        without expert parallelism."""
        return self.tp_size * self.dp_size if self.expert_parallel else 1

    @property
    def ep_rank(self) -> int:
        """This rank's place in the expert-parallel group (its global rank)."""
        return self.rank if self.expert_parallel else 0

    def ep_comm(self) -> Communicator | None:
        """The communicator routed-expert layers exchange tokens through, or None when
        the experts are whole on this rank (no expert parallelism, or one rank)."""
        return self.ep_communicator if self.ep_size > 1 else None

    @classmethod
    def single(cls) -> ParallelContext:
        """One process, no collectives."""
        return cls()

    @property
    def is_driver(self) -> bool:
        """Whether this rank samples and reports (tensor-parallel rank 0)."""
        return self.tp_rank == 0

    def comm(self) -> Communicator:
        """The tensor-parallel communicator; only parallel layers (tp_size > 1) ask."""
        if self.communicator is None:
            raise RuntimeError("this ParallelContext has no communicator (a single rank runs no collectives)")
        return self.communicator

    def tp_comm(self) -> Communicator | None:
        """The communicator a layer reduces through, or None when the layer is whole on
        this rank (tp_size 1: no collective at all)."""
        return self.comm() if self.tp_size > 1 else None


def init_parallel(
    backend: CommunicatorProvider, rank: int, world_size: int, tp_size: int, init_method: str,
    expert_parallel: bool = False, timeout: timedelta = COLLECTIVE_TIMEOUT,
) -> ParallelContext:
    """Join the torch.distributed world (`init_method` e.g. tcp://host:port) through the
    backend (its device and communicator) and build this rank's tensor-parallel group:
    consecutive ranks form a group of `tp_size`; the world holds world_size / tp_size
    data-parallel ranks. Every rank of the world must call it. `expert_parallel` splits
    routed experts across the whole world (EP = TP x DP). Every collective of the groups
    built here raises after `timeout` instead of waiting forever for a lost peer."""
    if tp_size < 1 or world_size % tp_size:
        raise ValueError(f"world size {world_size} is not a multiple of tensor_parallel_size {tp_size}")
    if not 0 <= rank < world_size:
        raise ValueError(f"rank {rank} is outside a world of {world_size}")
    backend.join_world(rank, world_size, init_method)
    group = None
    for start in range(0, world_size, tp_size):
        # new_group is collective: every rank creates every group, keeps its own.
        ranks = list(range(start, start + tp_size))
        created = dist.new_group(ranks, timeout=timeout)
        if rank in ranks:
            group = created
    # One communicator per process group: with a single data-parallel rank the EP group
    # is the TP group, so both names share one object.
    tp_comm = backend.communicator(group)
    dp_size = world_size // tp_size
    ep_comm = None
    if expert_parallel:
        ep_comm = tp_comm if dp_size == 1 else backend.communicator(dist.new_group(timeout=timeout))
    return ParallelContext(
        rank, world_size, rank % tp_size, tp_size, tp_comm, expert_parallel=expert_parallel,
        dp_rank=rank // tp_size, dp_size=dp_size, ep_communicator=ep_comm,
    )


def destroy_parallel() -> None:
    """Leave the torch.distributed world (a no-op when none was joined)."""
    if dist.is_available() and dist.is_initialized():
        dist.destroy_process_group()


__all__ = ["Communicator", "CommunicatorProvider", "ParallelContext", "destroy_parallel", "init_parallel"]
