"""Which slice of a checkpoint tensor a tensor-parallel rank holds.

Tensor parallel cuts linears along their output (column-parallel: q/k/v, gate/up,
vocab rows) or input (row-parallel: o_proj, down) dimension; attention cuts by heads,
and key/value heads fewer than ranks are replicated (a group of ranks shares one head).
"""

from __future__ import annotations

from dataclasses import dataclass

from . import ParallelContext


@dataclass(frozen=True)
class Shard:
    """Chunk `index` of `count` chunks along `dim`. Chunks are ceil(extent / count)
    long, so only the last may be short (vocabularies); count 1 is the whole tensor."""

    dim: int
    index: int
    count: int

    def bounds(self, extent: int) -> tuple[int, int]:
        """[start, stop) of this chunk in a dimension of `extent`."""
        chunk = -(-extent // self.count)
        start = min(extent, self.index * chunk)
        return start, min(extent, start + chunk)

    def extent(self, full: int) -> int:
        """This chunk's length in a dimension of `full`."""
        start, stop = self.bounds(full)
        return stop - start

    def extents(self, full: int) -> list[int]:
        """Every chunk's length, in chunk order (what each rank holds)."""
        return [Shard(self.dim, i, self.count).extent(full) for i in range(self.count)]

    @property
    def whole(self) -> bool:
        """Whether the chunk is the whole tensor (no slicing needed)."""
        return self.count == 1


WHOLE = Shard(0, 0, 1)


def split_evenly(parallel: ParallelContext, total: int, what: str, dim: int = 0) -> Shard:
    """This rank's equal share of `total` units along `dim` (heads, channels); raises
    ValueError naming `what` when they do not divide among the ranks."""
    if total % parallel.tp_size:
        raise ValueError(f"{what} ({total}) is not divisible by tensor_parallel_size {parallel.tp_size}")
    return Shard(dim, parallel.tp_rank, parallel.tp_size)


def kv_head_shard(parallel: ParallelContext, num_kv_heads: int) -> Shard:
    """This rank's key/value heads: an equal share when there are at least as many heads
    as ranks, else the one head its group of tp_size / num_kv_heads ranks replicates."""
    if num_kv_heads >= parallel.tp_size:
        return split_evenly(parallel, num_kv_heads, "num_key_value_heads")
    if parallel.tp_size % num_kv_heads:
        raise ValueError(
            f"tensor_parallel_size {parallel.tp_size} must be a multiple of num_key_value_heads {num_kv_heads} "
            "to replicate key/value heads"
        )
    return Shard(0, parallel.tp_rank * num_kv_heads // parallel.tp_size, num_kv_heads)


def rank_shard(parallel: ParallelContext, dim: int = 0) -> Shard:
    """This rank's chunk along `dim` where extents need not divide (vocabulary rows:
    the last rank's chunk may be shorter)."""
    return Shard(dim, parallel.tp_rank, parallel.tp_size)
