"""Helpers for tests that run tensor-parallel ranks: a free TCP port for the rendezvous,
and `spawn_ranks`, which runs a function on 2 gloo ranks (torch.multiprocessing spawn)
and returns what each rank returned. A uniquely named module, so spawned children
import it by name."""

from __future__ import annotations

import pickle
import socket
import tempfile
from pathlib import Path
from typing import Any, Callable

import torch.multiprocessing as mp

from accord.backends import get_backend
from accord.core.distributed import ParallelContext, destroy_parallel, init_parallel

WORLD_SIZE = 2


def free_port() -> int:
    """A TCP port nothing listens on right now."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def _rank_main(rank: int, fn: Callable[..., Any], args: tuple, backend: str, init_method: str, out_dir: str) -> None:
    parallel = init_parallel(get_backend(backend), rank, WORLD_SIZE, WORLD_SIZE, init_method)
    try:
        result = fn(parallel, *args)
    finally:
        destroy_parallel()
    Path(out_dir, f"rank{rank}.pkl").write_bytes(pickle.dumps(result))


def spawn_ranks(fn: Callable[..., Any], *args: Any, backend: str = "cpu") -> list[Any]:
    """`fn(parallel: ParallelContext, *args)` on each of 2 ranks; their results in rank
    order. `fn` must be a module-level function (spawn pickles it by name)."""
    with tempfile.TemporaryDirectory() as out_dir:
        init_method = f"tcp://127.0.0.1:{free_port()}"
        mp.spawn(_rank_main, args=(fn, args, backend, init_method, out_dir), nprocs=WORLD_SIZE, join=True)
        return [pickle.loads(Path(out_dir, f"rank{r}.pkl").read_bytes()) for r in range(WORLD_SIZE)]


__all__ = ["ParallelContext", "WORLD_SIZE", "free_port", "spawn_ranks"]
