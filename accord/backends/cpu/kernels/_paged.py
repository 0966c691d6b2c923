"""The parts of paged attention that are not the softmax: splitting a varlen step into
decodes and prefill chunks, and gathering a sequence's cached keys and values out of
the block-table cache into contiguous scratch tensors."""

from __future__ import annotations

from dataclasses import dataclass
from functools import cached_property

import torch

from ....op_contracts import FP8_DTYPES
from ._workspace import WORKSPACE

#: Decodes whose context lengths are within this ratio of their bucket's longest share
#: one padded batch, so padding is never more than a quarter of the gathered work.
DECODE_PADDING_RATIO = 0.75


@dataclass(frozen=True)
class StepLayout:
    """One step's sequences by kind. `decodes` lists (sequence, query row, cached
    length) of single-row sequences; `prefills` lists (sequence, first query row,
    query rows, cached length) of the rest; `owned_rows` is the span of query rows any
    sequence owns (rows outside it are padding)."""

    decodes: list[tuple[int, int, int]]
    prefills: list[tuple[int, int, int, int]]
    owned_rows: tuple[int, int]


def step_layout(query_start_loc: torch.Tensor, seq_lens: torch.Tensor) -> StepLayout:
    """Read the varlen metadata once, at whatever index width it comes in."""
    starts = query_start_loc.tolist()
    decodes, prefills = [], []
    for b, seq_len in enumerate(seq_lens.tolist()):
        start, q_len = starts[b], starts[b + 1] - starts[b]
        if q_len == 1:
            decodes.append((b, start, seq_len))
        elif q_len > 1:
            prefills.append((b, start, q_len, seq_len))
    return StepLayout(decodes, prefills, (starts[0], starts[-1]))


def decode_buckets(decodes: list[tuple[int, int, int]]) -> list[list[tuple[int, int, int]]]:
    """Decodes grouped by similar context length (longest first), so one padded batch
    per group wastes little work on padding."""
    ordered = sorted(decodes, key=lambda d: -d[2])
    buckets: list[list[tuple[int, int, int]]] = []
    for decode in ordered:
        if buckets and decode[2] >= DECODE_PADDING_RATIO * buckets[-1][0][2]:
            buckets[-1].append(decode)
        else:
            buckets.append([decode])
    return buckets


def visible(query_pos: torch.Tensor, key_pos: torch.Tensor, seq_len: torch.Tensor, sliding_window: int) -> torch.Tensor:
    """Which cached positions each query row may attend to: causal, inside the cached
    length, and within the sliding window when one is set."""
    seen = (key_pos <= query_pos) & (key_pos < seq_len)
    if sliding_window > 0:
        seen &= query_pos - key_pos < sliding_window
    return seen


@dataclass(frozen=True)
class DecodeBatch:
    """The index tensors of one padded decode batch: its query rows [n], the blocks
    gathered per sequence [n, nblk] (block 0 past a sequence's length), the flat
    positions of the padding [p] and the attention mask [n, 1, 1, nblk * BS].
    `row_span` is (first, end) when the rows are consecutive and in order (the query
    and output are then sliced, not indexed), else None."""

    rows: torch.Tensor
    block_ids: torch.Tensor
    padding: torch.Tensor
    visible: torch.Tensor
    row_span: tuple[int, int] | None = None


def decode_batch(
    decodes: list[tuple[int, int, int]], block_tables: torch.Tensor, block_size: int, sliding_window: int
) -> DecodeBatch:
    """The index tensors of one bucket of decodes (sequence, query row, cached length)."""
    seqs, rows, lens = (torch.tensor(column) for column in zip(*decodes))
    blocks = -(-int(lens.max()) // block_size)
    key_pos = torch.arange(blocks * block_size)
    in_sequence = key_pos < lens[:, None]  # [n, L]
    # Table entries past a sequence's length are unspecified: point them at block 0.
    block_ids = block_tables.index_select(0, seqs)[:, :blocks].long()
    block_ids.masked_fill_(~in_sequence[:, ::block_size], 0)
    padding = (~in_sequence).flatten().nonzero().squeeze(1)
    mask = visible(lens[:, None] - 1, key_pos, lens[:, None], sliding_window)
    span = (decodes[0][1], decodes[0][1] + len(decodes))
    row_span = span if [row for _, row, _ in decodes] == list(range(*span)) else None
    return DecodeBatch(rows, block_ids, padding, mask[:, None, None, :], row_span)


@dataclass(frozen=True)
class StepPlan:
    """What a step's attention needs besides the caches, the same for every layer:
    its layout and the index tensors of its padded decode batches (built on first use:
    where the C kernel attends the decodes, only the layout is read). `block_tables`
    is the plan's own copy of the step's table."""

    layout: StepLayout
    block_tables: torch.Tensor
    block_size: int
    sliding_window: int

    @cached_property
    def decode_batches(self) -> list[DecodeBatch]:
        """One padded batch per bucket of decodes of similar length."""
        return [
            decode_batch(bucket, self.block_tables, self.block_size, self.sliding_window)
            for bucket in decode_buckets(self.layout.decodes)
        ]


class StepPlans:
    """Step plans memoised across the layers of a step. Every layer is handed the same
    metadata, so the plan built for the first layer is reused while metadata equal to
    it comes back (compared by value: callers may refill persistent tensors in place).
    Plans are kept per (block size, sliding window), which layers may differ in."""

    def __init__(self) -> None:
        self._metadata: tuple[torch.Tensor, ...] = ()
        self._plans: dict[tuple[int, int], StepPlan] = {}

    def plan(
        self, query_start_loc: torch.Tensor, seq_lens: torch.Tensor, block_tables: torch.Tensor,
        block_size: int, sliding_window: int,
    ) -> StepPlan:
        """The plan for this metadata, built on first use."""
        metadata = (query_start_loc, seq_lens, block_tables)
        if not self._same(metadata):
            self._metadata = tuple(t.clone() for t in metadata)
            self._plans = {}
        plan = self._plans.get((block_size, sliding_window))
        if plan is None:
            layout = step_layout(query_start_loc, seq_lens)
            plan = self._plans[(block_size, sliding_window)] = StepPlan(
                layout, self._metadata[2], block_size, sliding_window
            )
        return plan

    def _same(self, metadata: tuple[torch.Tensor, ...]) -> bool:
        return len(self._metadata) == len(metadata) and all(
            kept.shape == t.shape and kept.dtype == t.dtype and torch.equal(kept, t)
            for kept, t in zip(self._metadata, metadata)
        )


#: The cpu kernels' plans (the engine's model runner is one thread per process).
STEP_PLANS = StepPlans()


@dataclass(frozen=True)
class PagedKV:
    """Where one layer's keys and values live: separate key and value caches (GQA), or
    one latent cache whose first `value_dim` channels are also the values (MLA, when
    `value_cache` is None). Caches are [NB, BS, Hk, D]; fp8 ones are read times their
    scale."""

    key_cache: torch.Tensor
    value_cache: torch.Tensor | None
    value_dim: int
    k_scale: float
    v_scale: float

    @property
    def block_size(self) -> int:
        """Cache positions per block (BS)."""
        return self.key_cache.shape[1]

    def gather(self, block_ids: torch.Tensor, dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
        """Keys and values of the blocks `block_ids` [n, nblk] as [n, nblk * BS, Hk, D]
        tensors of `dtype` (workspace views, valid until the next gather)."""
        keys = _gather(self.key_cache, block_ids, self.k_scale, dtype, "keys")
        if self.value_cache is None:
            return keys, keys[..., : self.value_dim]
        return keys, _gather(self.value_cache, block_ids, self.v_scale, dtype, "values")


def _gather(cache: torch.Tensor, block_ids: torch.Tensor, scale: float, dtype: torch.dtype, name: str) -> torch.Tensor:
    n, blocks = block_ids.shape
    _, block_size, *rest = cache.shape
    shape = (n * blocks, block_size, *rest)
    flat_ids = block_ids.reshape(-1)
    if cache.dtype == dtype:
        gathered = torch.index_select(cache, 0, flat_ids, out=WORKSPACE.take(name, shape, dtype))
    else:
        stored = cache
        if cache.dtype in FP8_DTYPES:  # index_select has no fp8 kernel; the bytes are uint8
            stored = cache.view(torch.uint8)
        raw = torch.index_select(stored, 0, flat_ids, out=WORKSPACE.take(f"{name}_raw", shape, stored.dtype))
        gathered = WORKSPACE.take(name, shape, dtype).copy_(raw.view(cache.dtype))
        if cache.dtype in FP8_DTYPES:
            gathered.mul_(scale)
    return gathered.view(n, blocks * block_size, *rest)
