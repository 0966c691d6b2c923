"""Builds each step: how many tokens every sequence computes, under the token and
sequence budgets (vLLM v1 style: no prefill or decode modes, just token counts).

Order within a step: running sequences that decode, then running sequences part-way
through their prompt, then waiting ones, so a long prompt is chunked and never stalls
the decodes. When blocks run out, the lowest-priority (then youngest) running sequence
is preempted: its blocks are freed and it is recomputed later, reusing whatever of
its prefix the cache still holds.
"""

from __future__ import annotations

import bisect
from collections.abc import Callable
from dataclasses import dataclass
from typing import Literal

from .block_manager import BlockManager
from .structured_output import GrammarBitmask
from .sequence import Sequence, SequenceStatus

Policy = Literal["fcfs", "priority"]


@dataclass(frozen=True)
class SchedulerOutput:
    """One step's work: tokens to compute per sequence, in batch order."""

    num_scheduled_tokens: dict[str, int]
    sequences: list[Sequence]
    #: Sequences preempted while building this step.
    preempted: list[Sequence]
    #: Allowed tokens of the constrained sequences that sample this step (filled in by
    #: the engine's structured output manager).
    grammar_bitmask: GrammarBitmask | None = None

    @property
    def total_num_scheduled_tokens(self) -> int:
        return sum(self.num_scheduled_tokens.values())

    @property
    def is_empty(self) -> bool:
        return not self.sequences


class Scheduler:
    """Owns the waiting and running queues; talks only to the block manager and the
    sequences."""

    def __init__(
        self,
        block_manager: BlockManager,
        max_num_batched_tokens: int,
        max_num_seqs: int,
        policy: Policy = "fcfs",
    ) -> None:
        if policy not in ("fcfs", "priority"):
            raise ValueError(f"unknown scheduling policy {policy!r}; use 'fcfs' or 'priority'")
        self.block_manager = block_manager
        self.max_num_batched_tokens = max_num_batched_tokens
        self.max_num_seqs = max_num_seqs
        # Smaller key = served first and preempted last.
        self.order_key: Callable[[Sequence], tuple[float, ...]] = (
            (lambda s: (s.times.arrival_time, s.arrival_order, s.index))
            if policy == "fcfs"
            else (lambda s: (s.priority, s.times.arrival_time, s.arrival_order, s.index))
        )
        self.waiting: list[Sequence] = []
        self.running: list[Sequence] = []
        self.num_preemptions = 0

    @property
    def num_unfinished(self) -> int:
        return len(self.waiting) + len(self.running)

    def add(self, seq: Sequence) -> None:
        """Queue a new (or preempted) sequence in policy order."""
        seq.status = SequenceStatus.WAITING
        bisect.insort(self.waiting, seq, key=self.order_key)

    def finish(self, seq: Sequence) -> None:
        """Take a sequence out of the queues (finished or aborted) and free its blocks."""
        if seq in self.running:
            self.running.remove(seq)
        elif seq in self.waiting:
            self.waiting.remove(seq)
        self.block_manager.free(seq.seq_id)

    def schedule(self) -> SchedulerOutput:
        """Pick this step's sequences and token counts, allocating their blocks."""
        budget = self.max_num_batched_tokens
        scheduled: dict[str, int] = {}
        batch: list[Sequence] = []
        preempted: list[Sequence] = []
        # Decodes first (one token left to compute), then partly computed prompts.
        for seq in sorted(self.running, key=lambda s: s.num_tokens - s.num_computed_tokens > 1):
            if budget == 0:
                break
            if seq.status is not SequenceStatus.RUNNING:
                continue  # preempted earlier in this loop
            count = min(seq.num_tokens - seq.num_computed_tokens, budget)
            while not self.block_manager.allocate(seq.seq_id, seq.num_computed_tokens + count):
                victim = max(self.running, key=self.order_key)
                self._preempt(victim)
                preempted.append(victim)
                if victim.seq_id in scheduled:
                    budget += scheduled.pop(victim.seq_id)
                    batch.remove(victim)
                if victim is seq:
                    break
            else:
                scheduled[seq.seq_id] = count
                batch.append(seq)
                budget -= count
        if not preempted:
            budget = self._admit_waiting(budget, scheduled, batch)
        for seq in batch:
            self.block_manager.cache_full_blocks(
                seq.seq_id, seq.token_ids, seq.num_computed_tokens + scheduled[seq.seq_id]
            )
        self.num_preemptions += len(preempted)
        return SchedulerOutput(scheduled, batch, preempted)

    def _admit_waiting(self, budget: int, scheduled: dict[str, int], batch: list[Sequence]) -> int:
        """Move waiting sequences to running, in policy order, while budgets and blocks
        allow; returns the token budget left."""
        index = 0
        while index < len(self.waiting) and budget > 0 and len(self.running) < self.max_num_seqs:
            seq = self.waiting[index]
            if self._waits_for_sibling(seq):
                index += 1
                continue
            # At least the last token is always computed: its logits are needed.
            cached = (
                []
                if seq.needs_prompt_logprobs
                else self.block_manager.find_cached_prefix(seq.token_ids, seq.num_tokens - 1)
            )
            computed = len(cached) * self.block_manager.block_size
            count = min(seq.num_tokens - computed, budget)
            if not self.block_manager.allocate(seq.seq_id, computed + count, cached):
                break
            del self.waiting[index]
            if seq.num_output_tokens == 0:
                seq.num_cached_tokens = computed
            seq.num_computed_tokens = computed
            seq.status = SequenceStatus.RUNNING
            self.running.append(seq)
            scheduled[seq.seq_id] = count
            batch.append(seq)
            budget -= count
        return budget

    def _waits_for_sibling(self, seq: Sequence) -> bool:
        """n > 1: a sample waits while its sibling computes the shared prompt, then
        reuses the sibling's cached prompt blocks instead of computing them again."""
        source = seq.prompt_source
        return (
            source is not None
            and self.block_manager.enable_prefix_caching
            and source.status is SequenceStatus.RUNNING
            and source.num_computed_tokens < source.num_prompt_tokens
        )

    def _preempt(self, seq: Sequence) -> None:
        self.running.remove(seq)
        self.block_manager.free(seq.seq_id)
        seq.num_computed_tokens = 0
        self.add(seq)
