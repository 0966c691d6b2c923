"""What the core needs of a communicator: the collectives the parallel layers call. The
backend provides the object (its dtype contract and adapters live with it); the core
never imports a backend, so it names the surface as a protocol."""

from __future__ import annotations

from typing import Protocol, Sequence

import torch


class Communicator(Protocol):
    """Collectives over one group of ranks, each checked against the communicator's dtype
    contract (a refused dtype raises ContractError; an adapted one is logged and counted)."""

    name: str
    rank: int
    world_size: int

    def all_reduce(self, x: torch.Tensor) -> torch.Tensor:
        """The elementwise sum of `x` over the ranks."""
        ...

    def all_gather(self, x: torch.Tensor, dim: int = 0, sizes: Sequence[int] | None = None) -> torch.Tensor:
        """The ranks' `x` concatenated along `dim` in rank order (`sizes` when uneven)."""
        ...

    def reduce_scatter(self, x: torch.Tensor, dim: int = 0, sizes: Sequence[int] | None = None) -> torch.Tensor:
        """This rank's slice along `dim` of the sum over the ranks (`sizes` when uneven)."""
        ...

    def all_to_all(
        self, x: torch.Tensor, output_split_sizes: Sequence[int], input_split_sizes: Sequence[int]
    ) -> torch.Tensor:
        """Rows of `x` scattered to the ranks by `input_split_sizes`, gathered back by
        `output_split_sizes`."""
        ...

    def carries(self, collective: str, dtype: torch.dtype) -> bool:
        """Whether `collective` takes `dtype` (natively or through a declared adapter)."""
        ...


class CommunicatorProvider(Protocol):
    """The backend facts `init_parallel` needs: how a rank joins the world, and the
    communicator over a group of it."""

    name: str
    dist_backend: str

    def join_world(self, rank: int, world_size: int, init_method: str) -> None:
        """Join the torch.distributed world through the device's communicator."""
        ...

    def communicator(self, group: object) -> Communicator:
        """The communicator over one process group."""
        ...
