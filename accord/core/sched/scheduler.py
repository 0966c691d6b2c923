"""Builds each step and owns request state: how many tokens every sequence computes
under the token and sequence budgets (vLLM v1 style: no prefill or decode modes, just
token counts), and what a step's results do to the sequences.

Order within a step: running sequences that decode, then running sequences part-way
through their prompt, then waiting ones, so a long prompt is chunked and never stalls
the decodes. When blocks run out, the lowest-priority (then youngest) running sequence
is preempted: its blocks are freed and it is recomputed later, reusing whatever of
its prefix the cache still holds.

The step goes to the workers as a plain `SchedulerOutput` (new requests in full,
running ones as diffs). As in vLLM v1, `num_computed_tokens` advances when a step is
scheduled, and a sequence whose step samples holds a placeholder for that token until
`update_from_output` applies the runner's results (appends the tokens, stops and frees
the sequences that must stop). So the next step can be scheduled while this one still
runs (async scheduling, at most one step ahead): a decode computes its placeholder
token, which the runner already holds, having sampled it. A sequence that stops when a
step's results land drops whatever the step after it computed for it.
"""

from __future__ import annotations

import bisect
import time
from collections.abc import Callable, Collection, Iterable
from typing import get_args

from .block_manager import BlockManager
from .check_stop import check_stop
from ..config import SchedulingPolicy
from .output import CachedRequestData, ModelRunnerOutput, NewRequestData, SchedulerOutput
from .request import Sequence, SequenceStatus
from ..stats import EngineStats
from ..structured_output import GrammarBitmask, StructuredOutputManager

class Scheduler:
    """Owns the waiting and running queues and every unfinished sequence; talks only
    to the block manager and the sequences."""

    def __init__(
        self,
        block_manager: BlockManager,
        max_num_batched_tokens: int,
        max_num_seqs: int,
        policy: SchedulingPolicy = "fcfs",
        *,
        max_model_len: int | None = None,
        eos_token_ids: Collection[int] = (),
        structured_output: StructuredOutputManager | None = None,
    ) -> None:
        if policy not in get_args(SchedulingPolicy):
            raise ValueError(f"unknown scheduling policy {policy!r}; use one of {', '.join(get_args(SchedulingPolicy))}")
        self.block_manager = block_manager
        self.max_num_batched_tokens = max_num_batched_tokens
        self.max_num_seqs = max_num_seqs
        self.max_model_len = max_model_len
        self.eos_token_ids = frozenset(eos_token_ids)
        #: Grammar matchers of constrained sequences, advanced here as tokens are accepted.
        self.structured_output = structured_output
        # Smaller key = served first and preempted last.
        self.order_key: Callable[[Sequence], tuple[float, ...]] = (
            (lambda s: (s.times.arrival_time, s.arrival_order, s.index))
            if policy == "fcfs"
            else (lambda s: (s.priority, s.times.arrival_time, s.arrival_order, s.index))
        )
        self.waiting: list[Sequence] = []
        self.running: list[Sequence] = []
        self.seqs: dict[str, Sequence] = {}
        self.stats = EngineStats(kv_blocks_total=block_manager.num_blocks)
        # What the runner holds: blocks sent per running sequence, and ids it must drop.
        self._blocks_sent: dict[str, int] = {}
        self._finished_ids: set[str] = set()

    @property
    def num_unfinished(self) -> int:
        return len(self.waiting) + len(self.running)

    @property
    def outstanding_tokens(self) -> int:
        """Tokens the unfinished sequences may still compute: prompt tokens not yet in
        the KV cache plus output tokens still allowed (max_tokens, capped by the context
        limit); what the data-parallel balancer compares."""
        total = 0
        for seq in self.seqs.values():
            limit = seq.num_prompt_tokens + (seq.params.max_tokens or self.max_model_len or 0)
            if self.max_model_len is not None:
                limit = min(limit, self.max_model_len)
            total += max(0, limit - seq.num_computed_tokens)
        return total

    @property
    def num_preemptions(self) -> int:
        return self.stats.num_preemptions

    def add(self, seq: Sequence) -> None:
        """Queue a new (or preempted) sequence in policy order."""
        seq.status = SequenceStatus.WAITING
        self.seqs[seq.seq_id] = seq
        bisect.insort(self.waiting, seq, key=self.order_key)

    def finish(self, seq: Sequence, reason: str | None = None, stop_reason: int | str | None = None) -> None:
        """Take a sequence out of the queues (finished, aborted or failed: `reason`,
        unless already marked) and free its blocks; the runner drops it next step."""
        if reason is not None:
            seq.finish(reason, stop_reason)
        if seq in self.running:
            self.running.remove(seq)
        elif seq in self.waiting:
            self.waiting.remove(seq)
        # A failed step may have left this sequence's blocks unwritten: never reuse them.
        self.block_manager.free(seq.seq_id, forget_cached=reason == "error")
        self.seqs.pop(seq.seq_id, None)
        if self.structured_output is not None:
            self.structured_output.remove(seq.seq_id)
        if self._blocks_sent.pop(seq.seq_id, None) is not None:
            self._finished_ids.add(seq.seq_id)
        self._update_gauges()

    def stop_on_string(self, seq: Sequence, stop_string: str) -> None:
        """The detokenised text completed a stop string: finish `seq` unless a stop
        token already did (check_stop's precedence)."""
        decision = check_stop(seq, self.max_model_len, self.eos_token_ids, stop_string)
        assert decision is not None
        if seq.finish_reason != decision[0] or seq.stop_reason != decision[1]:
            self.finish(seq, *decision)

    # -- building a step -------------------------------------------------------------
    def schedule(self) -> SchedulerOutput:
        """Pick this step's sequences and token counts, allocating their blocks."""
        budget = self.max_num_batched_tokens
        scheduled: dict[str, int] = {}
        batch: list[Sequence] = []
        preempted: list[Sequence] = []
        # Decodes first (one token left to compute), then partly computed prompts. A
        # sequence's count is fixed here: preempting another one leaves it unchanged.
        pending = [(seq, _tokens_to_compute(seq)) for seq in self.running]
        pending = [item for item in pending if item[1] <= 1] + [item for item in pending if item[1] > 1]
        for seq, to_compute in pending:
            if budget == 0:
                break
            if seq.status is not SequenceStatus.RUNNING or self._stops_when_tokens_land(seq):
                continue  # preempted earlier in this loop, or nothing more to compute
            count = min(to_compute, budget)
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
        admitted: list[Sequence] = []
        if not preempted:
            budget = self._admit_waiting(budget, scheduled, batch, admitted)
        if self.block_manager.enable_prefix_caching:
            for seq in batch:
                # Only known tokens have a block key: a placeholder's block is cached later.
                self.block_manager.cache_full_blocks(
                    seq.seq_id, seq.token_ids, min(seq.num_computed_tokens + scheduled[seq.seq_id], seq.num_tokens)
                )
        self.stats.num_preemptions += len(preempted)
        output = SchedulerOutput(
            scheduled_new_reqs=[self._new_request_data(seq) for seq in admitted],
            # The admitted sequences are the batch's tail (admission appends them last).
            scheduled_cached_reqs=self._cached_request_data(batch[: len(batch) - len(admitted)]),
            num_scheduled_tokens=scheduled,
            finished_req_ids=self._finished_ids,
            preempted_req_ids={seq.seq_id for seq in preempted},
        )
        output.grammar_bitmask = self._grammar_bitmask(scheduled)
        self._finished_ids = set()
        for seq in batch:
            self._advance(seq, scheduled[seq.seq_id])
        self._update_gauges()
        return output

    def _advance(self, seq: Sequence, count: int) -> None:
        """Count a scheduled step's tokens as computed, and hold a placeholder for the
        token it samples when it reaches the end of the sequence."""
        start = seq.num_computed_tokens
        self.stats.computed_prompt_tokens += max(0, min(start + count, seq.num_prompt_tokens) - start)
        seq.num_computed_tokens = start + count
        if seq.num_computed_tokens == seq.num_tokens + seq.num_output_placeholders:
            seq.num_output_placeholders += 1

    def _stops_when_tokens_land(self, seq: Sequence) -> bool:
        """Whether the tokens in flight already bring `seq` to max_tokens or the context
        limit: it stops when they land, so another step would compute past its end."""
        if seq.num_output_placeholders == 0:
            return False
        max_tokens = seq.params.max_tokens
        if max_tokens is not None and seq.num_output_tokens + seq.num_output_placeholders >= max_tokens:
            return True
        return self.max_model_len is not None and seq.num_tokens + seq.num_output_placeholders >= self.max_model_len

    def needs_landed_tokens(self) -> bool:
        """Whether the next step must wait for the results of the step in flight: a
        grammar-constrained sequence's token mask follows from its last sampled token,
        so async scheduling runs steps one at a time while such a sequence is unfinished."""
        constrained = self.structured_output
        return constrained is not None and any(constrained.is_constrained(seq_id) for seq_id in self.seqs)

    def _grammar_bitmask(self, scheduled: dict[str, int]) -> GrammarBitmask | None:
        """The token bitmask of the constrained sequences that sample this step."""
        constrained = self.structured_output
        if constrained is None:
            return None
        sampling = [
            seq_id for seq_id, count in scheduled.items()
            if constrained.is_constrained(seq_id) and _tokens_to_compute(self.seqs[seq_id]) == count
        ]
        return constrained.grammar_bitmask(sampling) if sampling else None

    def _new_request_data(self, seq: Sequence) -> NewRequestData:
        table = self.block_manager.block_table(seq.seq_id)
        self._blocks_sent[seq.seq_id] = len(table)
        return NewRequestData(
            req_id=seq.seq_id,
            prompt_token_ids=seq.prompt_token_ids,
            output_token_ids=list(seq.output_token_ids),
            sampling_params=seq.params,
            block_ids=list(table),
            num_computed_tokens=seq.num_computed_tokens,
            num_prompt_logprobs=seq.params.prompt_logprobs if seq.needs_prompt_logprobs else None,
            num_prompt_logprobs_done=len(seq.prompt_logprobs) if seq.prompt_logprobs is not None else 0,
        )

    def _cached_request_data(self, seqs: list[Sequence]) -> CachedRequestData:
        data = CachedRequestData()
        for seq in seqs:
            table = self.block_manager.block_table(seq.seq_id)
            data.req_ids.append(seq.seq_id)
            data.new_block_ids.append(table[self._blocks_sent[seq.seq_id] :])
            data.num_computed_tokens.append(seq.num_computed_tokens)
            self._blocks_sent[seq.seq_id] = len(table)
        return data

    def _admit_waiting(
        self, budget: int, scheduled: dict[str, int], batch: list[Sequence], admitted: list[Sequence]
    ) -> int:
        """Move waiting sequences to running, in policy order, while budgets and blocks
        allow; returns the token budget left."""
        index = 0
        while index < len(self.waiting) and budget > 0 and len(self.running) < self.max_num_seqs:
            seq = self.waiting[index]
            # A preempted sequence resumes once its last step's token has landed (the
            # runner is sent its tokens in full).
            if seq.num_output_placeholders or self._waits_for_sibling(seq):
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
            # Admission starts from the cached prefix (a preemption reset it to 0).
            seq.num_computed_tokens = computed
            seq.status = SequenceStatus.RUNNING
            self.running.append(seq)
            scheduled[seq.seq_id] = count
            batch.append(seq)
            admitted.append(seq)
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
        # The runner drops a preempted sequence; it comes back as a new request.
        self._blocks_sent.pop(seq.seq_id, None)
        seq.num_computed_tokens = 0
        self.add(seq)

    # -- applying a step's results -----------------------------------------------------
    def update_from_output(self, step: SchedulerOutput, result: ModelRunnerOutput) -> list[Sequence]:
        """Apply a step's results: record prompt logprobs, put the sampled tokens in
        place of their placeholders, stop and free the sequences that must stop
        (check_stop). Results of sequences that ended since the step was scheduled are
        dropped. Returns the sequences the step touched, in batch order."""
        now = time.monotonic()
        touched: list[Sequence] = []
        for seq_id in step.num_scheduled_tokens:
            seq = self.seqs.get(seq_id)
            if seq is None:
                continue  # ended (finished, aborted, failed) after the step was built
            if seq.times.first_scheduled_time is None:
                seq.times.first_scheduled_time = now
            touched.append(seq)
        for seq_id, entries in result.prompt_logprobs.items():
            seq = self.seqs.get(seq_id)
            if seq is not None and seq.prompt_logprobs is not None:
                seq.prompt_logprobs.extend(entries)
        for seq_id, token, logprob, top in zip(
            result.req_ids, result.sampled_token_ids, result.logprobs, result.top_logprobs
        ):
            seq = self.seqs.get(seq_id)
            if seq is not None:
                self._append(seq, token, logprob, top, now)
        self.stats.num_steps += 1
        self.stats.observe_iteration(step.total_num_scheduled_tokens)
        self._update_gauges()
        return touched

    def _append(self, seq: Sequence, token: int, logprob: float, top: dict | None, now: float) -> None:
        if seq.times.first_token_time is None:
            seq.times.first_token_time = now
        if seq.num_output_tokens == 0 and seq.index == 0:
            self.stats.prompt_tokens += seq.num_prompt_tokens
        seq.times.num_generation_tokens += 1
        self.stats.generation_tokens += 1
        seq.num_output_placeholders = max(0, seq.num_output_placeholders - 1)
        seq.append_token(token, logprob, top)
        decision = check_stop(seq, self.max_model_len, self.eos_token_ids)
        grammar_complete = self.structured_output is not None and self.structured_output.accept(seq.seq_id, token)
        if decision is None and grammar_complete:
            decision = "stop", None  # the grammar admits nothing more
        if decision is not None:
            self.finish(seq, *decision)

    def fail(self, seq_ids: Iterable[str], message: str) -> list[Sequence]:
        """Finish the given sequences with finish_reason "error" and the error's text as
        stop_reason (a step failed because of them); returns those still unfinished."""
        failed = [self.seqs[seq_id] for seq_id in seq_ids if seq_id in self.seqs]
        for seq in failed:
            self.finish(seq, "error", message)
        return failed

    def _update_gauges(self) -> None:
        stats, manager = self.stats, self.block_manager
        stats.num_running = len(self.running)
        stats.num_waiting = len(self.waiting)
        stats.kv_blocks_used = manager.num_used_blocks
        stats.prefix_cache_queries = manager.counters.queries
        stats.prefix_cache_hits = manager.counters.hits


def _tokens_to_compute(seq: Sequence) -> int:
    """Tokens of `seq` no scheduled step computes yet: known ones past its computed
    count, and the placeholders of tokens being sampled."""
    return seq.num_tokens + seq.num_output_placeholders - seq.num_computed_tokens
