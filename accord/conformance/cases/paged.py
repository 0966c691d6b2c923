"""Paged-cache layouts shared by the cache-writer and attention cases: sequences
scattered over shuffled physical blocks, with lengths on and just past block edges."""

from __future__ import annotations

from dataclasses import dataclass

import torch

BLOCK_SIZE = 16


@dataclass(frozen=True)
class PagedBatch:
    """One varlen batch over a paged cache: its metadata (as int64; cases cast it to
    the index dtype under test) and the number of physical blocks it needs."""

    block_tables: torch.Tensor
    seq_lens: torch.Tensor
    query_start_loc: torch.Tensor
    num_blocks: int

    @property
    def num_tokens(self) -> int:
        return int(self.query_start_loc[-1])

    def metadata(self, dtype: torch.dtype) -> dict[str, torch.Tensor]:
        """The three metadata tensors (one dtype group) at `dtype`."""
        return {
            "block_tables": self.block_tables.to(dtype),
            "seq_lens": self.seq_lens.to(dtype),
            "query_start_loc": self.query_start_loc.to(dtype),
        }


def paged_batch(generator: torch.Generator, sequences: tuple[tuple[int, int], ...]) -> PagedBatch:
    """A batch of (new query tokens, cached length) sequences whose blocks are a random
    permutation of the cache, plus one spare block nobody owns."""
    blocks_per_seq = [-(-seq_len // BLOCK_SIZE) for _, seq_len in sequences]
    num_blocks = sum(blocks_per_seq) + 1
    physical = torch.randperm(num_blocks, generator=generator).tolist()
    # Unused table entries point at a real block, so a kernel that over-reads reads
    # garbage rather than crashing; causality must mask it out.
    tables = torch.full((len(sequences), max(blocks_per_seq)), physical[-1], dtype=torch.int64)
    start = 0
    for b, count in enumerate(blocks_per_seq):
        tables[b, :count] = torch.tensor(physical[start : start + count])
        start += count
    q_lens = torch.tensor([q for q, _ in sequences])
    return PagedBatch(
        block_tables=tables,
        seq_lens=torch.tensor([s for _, s in sequences]),
        query_start_loc=torch.cat([torch.zeros(1, dtype=torch.int64), q_lens.cumsum(0)]),
        num_blocks=num_blocks,
    )


def slot_mapping(generator: torch.Generator, tokens: int, num_slots: int, dtype: torch.dtype) -> torch.Tensor:
    """Distinct random slots for `tokens` tokens, the second one -1 (padding) when
    there is more than one token."""
    slots = torch.randperm(num_slots, generator=generator)[:tokens]
    if tokens > 1:
        slots[1] = -1
    return slots.to(dtype)
