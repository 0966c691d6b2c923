"""Which slice of a checkpoint tensor a tensor-parallel rank holds.

Tensor parallel cuts linears along their output (column-parallel: q/k/v, gate/up,
vocab rows) or input (row-parallel: o_proj, down) dimension; attention cuts by heads,
and key/value heads fewer than ranks are replicated (a group of ranks shares one head).
Heads that do not divide among the ranks are cut by whole key/value groups, unevenly
(SmolLM2-135M's 9 query and 3 key/value heads over 2 ranks: 3 + 6 query heads).
Expert parallel places whole routed experts, contiguous ranges, unevenly where they
do not divide (vLLM's placement, `expert_range`).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from . import ParallelContext


@dataclass(frozen=True)
class Shard:
    """Chunk `index` of `count` chunks along `dim`. Chunks are ceil(extent / count)
    long, so only the last may be short (vocabularies); count 1 is the whole tensor.
    With `parts`, the extent is `parts` indivisible pieces (key/value head groups),
    dealt out as evenly as whole pieces go (chunk i holds pieces i*parts//count up to
    (i+1)*parts//count), so one shard cuts a tensor measured in heads and the same
    tensor measured in rows (heads x head_dim) at the same heads."""

    dim: int
    index: int
    count: int
    parts: int | None = None

    def bounds(self, extent: int) -> tuple[int, int]:
        """[start, stop) of this chunk in a dimension of `extent`."""
        if self.parts is not None:
            piece = extent // self.parts
            return (self.index * self.parts // self.count * piece, (self.index + 1) * self.parts // self.count * piece)
        chunk = -(-extent // self.count)
        start = min(extent, self.index * chunk)
        return start, min(extent, start + chunk)

    def extent(self, full: int) -> int:
        """This chunk's length in a dimension of `full`."""
        start, stop = self.bounds(full)
        return stop - start

    def extents(self, full: int) -> list[int]:
        """Every chunk's length, in chunk order (what each rank holds)."""
        return [Shard(self.dim, i, self.count, self.parts).extent(full) for i in range(self.count)]

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


def head_shards(parallel: ParallelContext, num_heads: int, num_kv_heads: int) -> tuple[Shard, Shard]:
    """This rank's (query head, key/value head) shards. With at least as many key/value
    heads as ranks, each rank takes whole groups of a key/value head and its query
    heads: equal shares where they divide, else dealt out as evenly as groups go. Fewer
    key/value heads than ranks are replicated (a group of tp_size / num_kv_heads ranks
    shares one), the query heads split equally."""
    tp = parallel.tp_size
    if num_kv_heads >= tp:
        by_group = Shard(0, parallel.tp_rank, tp, parts=num_kv_heads)
        return by_group, by_group
    if num_heads % tp:
        raise ValueError(
            f"num_attention_heads ({num_heads}) is not divisible by tensor_parallel_size {tp}, and its "
            f"{num_kv_heads} key/value heads are too few to give each rank a whole group"
        )
    if tp % num_kv_heads:
        raise ValueError(
            f"tensor_parallel_size {tp} must be a multiple of num_key_value_heads {num_kv_heads} "
            "to replicate key/value heads"
        )
    return Shard(0, parallel.tp_rank, tp), Shard(0, parallel.tp_rank * num_kv_heads // tp, num_kv_heads)


def rank_shard(parallel: ParallelContext, dim: int = 0) -> Shard:
    """This rank's chunk along `dim` where extents need not divide (vocabulary rows:
    the last rank's chunk may be shorter)."""
    return Shard(dim, parallel.tp_rank, parallel.tp_size)


def expert_range(num_experts: int, ep_size: int, ep_rank: int) -> range:
    """The contiguous routed experts expert-parallel rank `ep_rank` holds, placed as
    vLLM places them: base = num_experts // ep_size each, the first num_experts %
    ep_size ranks one more (5 experts over 2 ranks: 0-2 and 3-4). Raises ValueError
    when some rank would hold none (fewer experts than ranks), the one layout that
    cannot work: fused_moe needs at least one local expert."""
    if num_experts < ep_size:
        raise ValueError(f"{num_experts} routed experts are fewer than the expert-parallel size {ep_size}: "
                         "a rank would hold no expert")
    base, extra = divmod(num_experts, ep_size)
    start = ep_rank * base + min(ep_rank, extra)
    return range(start, start + base + (ep_rank < extra))


def expert_owners(num_experts: int, ep_size: int) -> torch.Tensor:
    """[num_experts] int64: the expert-parallel rank holding each expert (`expert_range`)."""
    owners = torch.empty(num_experts, dtype=torch.int64)
    for rank in range(ep_size):
        placed = expert_range(num_experts, ep_size, rank)
        owners[placed.start : placed.stop] = rank
    return owners
