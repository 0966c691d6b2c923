"""Run a function on N local ranks of a backend's torch.distributed world: the harness
of the collective conformance cases and of the tensor-parallel tests.

Each rank is a spawned process that joins the world through its backend
(`Backend.join_world`), calls `fn(communicator, *args)` with the communicator over the
whole world and hands back what it returned (pickled through a temporary directory);
the caller gets the results in rank order.
"""

from __future__ import annotations

import pickle
import socket
import tempfile
from pathlib import Path
from typing import Any, Callable

import torch.distributed as dist
import torch.multiprocessing as mp

from ..backends import default_registry


def free_port() -> int:
    """A local TCP port nothing listens on right now (the ranks' rendezvous)."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def _rank_main(
    rank: int, fn: Callable[..., Any], args: tuple, backend_name: str, world_size: int, init_method: str, out_dir: str
) -> None:
    backend = default_registry().get(backend_name)
    backend.join_world(rank, world_size, init_method)
    try:
        result = fn(backend.communicator(dist.group.WORLD), *args)
    finally:
        dist.destroy_process_group()
    Path(out_dir, f"rank{rank}.pkl").write_bytes(pickle.dumps(result))


def spawn_ranks(fn: Callable[..., Any], *args: Any, backend_name: str = "cpu", world_size: int = 2) -> list[Any]:
    """`fn(communicator, *args)` on each of `world_size` ranks; their results in rank
    order. `fn` must be importable by name (spawn pickles it)."""
    with tempfile.TemporaryDirectory() as out_dir:
        init_method = f"tcp://127.0.0.1:{free_port()}"
        mp.spawn(
            _rank_main, args=(fn, args, backend_name, world_size, init_method, out_dir), nprocs=world_size, join=True
        )
        return [pickle.loads(Path(out_dir, f"rank{r}.pkl").read_bytes()) for r in range(world_size)]
