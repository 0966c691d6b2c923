"""Builds each step and owns every request's progress: how many tokens each request
computes under the token and sequence budgets (vLLM v1 style: no prefill or decode
modes, just token counts), and what a step's results do to the requests.

Order within a step: running requests that decode, then running requests part-way
through their prompt, then waiting ones, so a long prompt is chunked and never stalls
the decodes. When blocks run out, a running request is preempted: of the policy's
highest preemption class (priority's lowest priority, effort's longest lane), the one
cheapest to rebuild (`rebuild_cost`: a short context recomputes cheaply, a long one
the CPU tier holds is swapped back in), then the youngest. Its blocks are freed and
it is rebuilt later, from whatever of its prefix the cache or the tier still holds.

A waiting request whose prefix a KV connector loads asynchronously (vLLM's
load_async) is given the blocks for it and waits, WAITING_FOR_REMOTE_KVS, outside the
queues while the workers load it: no step computes it, and the others' steps go on.
When a step's output reports the load ended (`finish_loads`) it is queued again with
those tokens computed (a failed load: with none, and it computes them); one that ended
while loading keeps its blocks (the load still writes them) until the load has ended.

The step goes to the workers as a plain `SchedulerOutput` (new requests in full,
running ones as diffs). As in vLLM v1, `num_computed_tokens` advances when a step is
scheduled, and a request whose step samples holds a placeholder for that token until
`update_from_output` applies the runner's results (appends the tokens, stops and frees
the requests that must stop) and returns, per request, plain `RequestUpdate`s (vLLM's
EngineCoreOutputs): nothing outside the scheduler holds or writes a `Request`. So the
next step can be scheduled while this one still runs (async scheduling, at most one
step ahead): a decode computes its placeholder token, which the runner already holds,
having sampled it. A request that stops when a step's results land drops whatever the
step after it computed for it.
"""

from __future__ import annotations

import bisect
import logging
import time
from collections import Counter
from collections.abc import Callable, Collection, Iterable, Sequence
from typing import get_args

from ..config import SchedulingPolicy
from ..kv_transfer.base import KVConnectorMetadata, KVConnectorScheduler, ScheduledChunk, TransferRequest
from ..outputs import Logprob
from ..spec_decode.adaptive import AdaptiveDrafting
from ..spec_decode.config import SpeculativeConfig
from ..stats import PREEMPTED_FOR_KV_CACHE, PREEMPTED_FOR_LANE_SHARE, EngineStats, LatencyHistogram
from ..structured_output import GrammarBitmask, StructuredOutputManager
from .block_manager import BlockKey, BlockManager
from .check_stop import check_stop
from .policy import QueuePolicy, make_policy
from .output import CachedRequestData, ModelRunnerOutput, NewRequestData, RequestUpdate, SchedulerOutput
from .request import Request, RequestStatus

logger = logging.getLogger("accord.sched")


class Scheduler:
    """Owns the waiting and running queues and every unfinished request (one
    registry, `requests`); talks only to the block manager and its requests."""

    def __init__(
        self,
        block_manager: BlockManager,
        max_num_batched_tokens: int,
        max_num_seqs: int,
        policy: SchedulingPolicy | QueuePolicy = "fcfs",
        *,
        max_model_len: int | None = None,
        eos_token_ids: Collection[int] = (),
        structured_output: StructuredOutputManager | None = None,
        speculative: SpeculativeConfig | None = None,
        max_loras: int = 0,
        max_thinking_tokens_per_tenant: int | None = None,
        kv_connector: KVConnectorScheduler | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        if not isinstance(policy, QueuePolicy) and policy not in get_args(SchedulingPolicy):
            raise ValueError(f"unknown scheduling policy {policy!r}; use one of {', '.join(get_args(SchedulingPolicy))}")
        self.block_manager = block_manager
        self.max_num_batched_tokens = max_num_batched_tokens
        self.max_num_seqs = max_num_seqs
        self.max_model_len = max_model_len
        self.eos_token_ids = frozenset(eos_token_ids)
        #: Grammar matchers of constrained requests, advanced here as tokens are accepted.
        self._structured_output = structured_output
        #: Speculative decoding's setup (None: off): proposals land with a step's results.
        self._speculative = speculative
        #: Acceptance and step-time measurements that choose how many drafts a step
        #: checks (None: every proposal, as far as the step's room allows).
        self._adaptive = (
            AdaptiveDrafting() if speculative is not None and speculative.adaptive_num_speculative_tokens else None
        )
        #: Distinct LoRA adapters the running requests may use at once (the device slots).
        self.max_loras = max_loras
        #: The remaining thinking-budget tokens one tenant's thinking requests may hold
        #: running together (None: no cap).
        self.max_thinking_tokens_per_tenant = max_thinking_tokens_per_tenant
        #: The scheduler half of a KV connector (None: no KV comes from or goes outside).
        self.kv_connector = kv_connector
        #: Seconds on the clock requests' arrival times are read on (their queue time).
        self._clock = clock
        #: The order of the queues and who may be admitted (sched/policy.py).
        self.policy = make_policy(policy, max_num_seqs, max_model_len)
        # Smaller key = served first and preempted last.
        self.order_key: Callable[[Request], tuple[float, ...]] = self.policy.order_key
        self.waiting: list[Request] = []
        self.running: list[Request] = []
        #: Every unfinished request, by id.
        self.requests: dict[str, Request] = {}
        self.stats = EngineStats(kv_blocks_total=block_manager.num_blocks)
        # What the runner holds: blocks sent per running request, and ids it must drop.
        self._blocks_sent: dict[str, int] = {}
        self._finished_ids: set[str] = set()
        self._unloaded_lora_ids: set[int] = set()
        #: Finished requests whose blocks the KV connector keeps for a remote reader,
        #: with their session ids (for the block manager's free).
        self._kept_blocks: dict[str, str | None] = {}
        #: Requests whose KV a connector loads off the step path (WAITING_FOR_REMOTE_KVS),
        #: and those that ended meanwhile (their blocks freed when the load ends), with
        #: their session ids.
        self._loading: dict[str, Request] = {}
        self._ended_loading: dict[str, str | None] = {}

    @property
    def num_unfinished(self) -> int:
        return len(self.waiting) + len(self.running) + len(self._loading)

    @property
    def outstanding_tokens(self) -> int:
        """Tokens the unfinished requests may still compute: prompt tokens not yet in
        the KV cache plus output tokens still allowed (max_tokens, capped by the context
        limit); what the data-parallel balancer compares."""
        total = 0
        for request in self.requests.values():
            limit = request.num_prompt_tokens + (request.max_output_tokens or self.max_model_len or 0)
            if self.max_model_len is not None:
                limit = min(limit, self.max_model_len)
            total += max(0, limit - request.num_computed_tokens)
        return total

    @property
    def num_preemptions(self) -> int:
        return self.stats.num_preemptions

    def add_request(self, request: Request, grammar: str | None = None) -> None:
        """Take ownership of a new request, constrained by `grammar` (a checked
        grammar from StructuredOutputManager.compile) when given."""
        if request.req_id in self.requests:
            raise ValueError(f"request {request.req_id!r} is already scheduled")
        if grammar is not None:
            if self._structured_output is None:
                raise ValueError("this scheduler has no structured output manager for a grammar")
            self._structured_output.add(request.req_id, grammar)
        self.requests[request.req_id] = request
        self._queue(request)

    def _queue(self, request: Request) -> None:
        """Put a new (or preempted) request in the waiting queue, in policy order."""
        request.status = RequestStatus.WAITING
        bisect.insort(self.waiting, request, key=self.order_key)

    def finish_requests(
        self, req_ids: Iterable[str], reason: str, stop_reason: int | str | None = None
    ) -> list[RequestUpdate]:
        """Finish the given unfinished requests (aborted, stopped by a stop string the
        output processor found, failed: `reason`) and free their blocks; the runner
        drops them next step. Unknown or finished ids are ignored. Returns each one's
        final update."""
        finished = [self.requests[req_id] for req_id in req_ids if req_id in self.requests]
        for request in finished:
            self._finish(request, reason, stop_reason)
        return [RequestUpdate(r.req_id, finish_reason=r.finish_reason, stop_reason=r.stop_reason) for r in finished]

    @property
    def awaits_transfers(self) -> bool:
        """Whether finished requests' blocks wait for a remote instance to read them, or
        the KV connector has a notification for the workers to send (the engine keeps
        stepping, so the workers report the reads and send the notifications)."""
        return bool(self._kept_blocks or self._loading or self._ended_loading) or (
            self.kv_connector is not None and self.kv_connector.has_pending_metadata()
        )

    def free_transferred(self, finished_sending: Collection[str]) -> None:
        """Free the kept blocks the KV connector lets go of: read by the remote
        instance (`finished_sending`, from the workers) or given up on."""
        if not self._kept_blocks:
            return
        for req_id in self.kv_connector.blocks_to_free(finished_sending):
            if req_id in self._kept_blocks:
                self.block_manager.free(req_id, session_id=self._kept_blocks.pop(req_id))
        self._update_gauges()

    def finish_loads(self, finished: Collection[str], failed: dict[str, str]) -> None:
        """The workers report these asynchronous loads ended (`failed`: with the error's
        text): queue their requests again, with the loaded tokens computed (a failed
        one with none: it computes them, and asks the connector for nothing more), and
        free the blocks of those that ended meanwhile."""
        if not finished and not failed:
            return
        self.kv_connector.loads_finished(finished, failed.keys())
        for req_id in [*finished, *failed]:
            if req_id in self._ended_loading:
                self.block_manager.free(req_id, session_id=self._ended_loading.pop(req_id))
                continue
            request = self._loading.pop(req_id, None)
            if request is None:
                continue
            if req_id in failed:
                logger.warning("%s: the KV connector could not load its KV (%s); computing it", req_id, failed[req_id])
                self.block_manager.free(req_id, session_id=request.session_id)
                request.num_computed_tokens = 0
                request.kv_load_failed = True
                self.stats.kv_loads_failed += 1
            self._queue(request)
        self._update_gauges()

    def step_failed(self, step: SchedulerOutput) -> None:
        """`step` raised in the workers: the KV connector's saves of it did not happen."""
        if self.kv_connector is not None and step.kv_connector_metadata is not None:
            self.kv_connector.step_failed(step.kv_connector_metadata)

    def fail(self, req_ids: Iterable[str], message: str) -> list[RequestUpdate]:
        """Finish the given requests with finish_reason "error" and the error's text as
        stop_reason (a step failed because of them)."""
        return self.finish_requests(req_ids, "error", message)

    def _finish(self, request: Request, reason: str, stop_reason: int | str | None = None) -> dict | None:
        """End `request` and free its blocks; returns what the KV connector hands its
        caller (kv_transfer_params), if anything."""
        loading = self._loading.pop(request.req_id, None) is not None
        request.finish(reason, stop_reason)
        if request in self.running:
            self.running.remove(request)
        elif request in self.waiting:
            self.waiting.remove(request)
        kv_transfer_params = None
        if self.kv_connector is not None:
            kv_transfer_params = self.kv_connector.request_finished(self._transfer_request(request, ()))
        if loading:
            # The load still writes them: freed once it has ended (finish_loads).
            self._ended_loading[request.req_id] = request.session_id
        elif self.kv_connector is not None and self.kv_connector.keeps_blocks(request.req_id):
            # A remote instance reads them: freed once it has (free_transferred).
            self._kept_blocks[request.req_id] = request.session_id
        else:
            # A failed step may have left this request's blocks unwritten: never reuse them.
            self.block_manager.free(request.req_id, forget_cached=reason == "error", session_id=request.session_id)
        self.requests.pop(request.req_id, None)
        if self._structured_output is not None:
            self._structured_output.remove(request.req_id)
        if self._adaptive is not None:
            self._adaptive.forget(request.req_id)
        if self._blocks_sent.pop(request.req_id, None) is not None:
            self._finished_ids.add(request.req_id)
        self._update_gauges()
        return kv_transfer_params

    # -- building a step -------------------------------------------------------------
    def schedule(self) -> SchedulerOutput:
        """Pick this step's requests and token counts, allocating their blocks."""
        budget = self.max_num_batched_tokens
        scheduled: dict[str, int] = {}
        drafts: dict[str, list[int]] = {}
        batch: list[Request] = []
        preempted: list[Request] = []
        # Room the policy makes for waiting requests it puts first (effort lanes).
        made_room = self.policy.preemptions(self.running, self.waiting)
        for victim in made_room:
            self._preempt(victim, PREEMPTED_FOR_LANE_SHARE)
        speculating = self._speculation_on()
        # Decodes first (one token left to compute), then partly computed prompts. A
        # request's count is fixed here: preempting another one leaves it unchanged.
        pending = [(request, _tokens_to_compute(request)) for request in self.running]
        pending = [item for item in pending if item[1] <= 1] + [item for item in pending if item[1] > 1]
        # Drafts take only budget the decodes after them do not need: a batch's decodes
        # all advance before any request checks drafts.
        decodes_left = sum(1 for _, to_compute in pending if to_compute <= 1)
        draft_limits = self._draft_limits(pending) if speculating else {}
        for request, to_compute in pending:
            decodes_left -= to_compute <= 1
            if budget == 0:
                break
            if request.status is not RequestStatus.RUNNING or self._stops_when_tokens_land(request):
                continue  # preempted earlier in this loop, or nothing more to compute
            proposal, request.spec_token_ids = request.spec_token_ids, []
            if speculating and to_compute == 1:
                limit = draft_limits.get(request.req_id, len(proposal))
                proposal = proposal[: min(limit, self._draft_room(request, budget - max(0, decodes_left)))]
            else:
                proposal = []
            count = min(to_compute + len(proposal), budget)
            while not self.block_manager.allocate(request.req_id, self._slots(request.num_computed_tokens + count)):
                victim = self._preemption_victim()
                self._preempt(victim, PREEMPTED_FOR_KV_CACHE)
                preempted.append(victim)
                if victim.req_id in scheduled:
                    budget += scheduled.pop(victim.req_id)
                    drafts.pop(victim.req_id, None)
                    batch.remove(victim)
                if victim is request:
                    break
            else:
                scheduled[request.req_id] = count
                if proposal:
                    drafts[request.req_id] = proposal
                batch.append(request)
                budget -= count
        admitted: list[Request] = []
        if not preempted:
            budget = self._admit_waiting(budget, scheduled, batch, admitted)
        if self.block_manager.enable_prefix_caching:
            for request in batch:
                # Only known tokens have a block key: a placeholder's block is cached later.
                self.block_manager.cache_full_blocks(
                    request.req_id,
                    request.token_ids,
                    min(request.num_computed_tokens + scheduled[request.req_id], request.num_tokens),
                    request.chain_root,
                )
        preempted += made_room
        output = SchedulerOutput(
            scheduled_new_reqs=[self._new_request_data(request) for request in admitted],
            # The admitted requests are the batch's tail (admission appends them last).
            scheduled_cached_reqs=self._cached_request_data(batch[: len(batch) - len(admitted)]),
            num_scheduled_tokens=scheduled,
            finished_req_ids=self._finished_ids,
            preempted_req_ids={request.req_id for request in preempted},
            scheduled_spec_decode_tokens=drafts,
            kv_connector_metadata=self._kv_connector_metadata(batch, scheduled),
            unloaded_lora_ids=frozenset(self._unloaded_lora_ids),
        )
        output.grammar_bitmask = self._grammar_bitmask(scheduled)
        if self._adaptive is not None:
            output.propose_for_req_ids = self._adaptive.worth_proposing([request.req_id for request in batch])
        self._finished_ids = set()
        self._unloaded_lora_ids = set()
        for request in batch:
            self._advance(request, scheduled[request.req_id])
        self._update_gauges()
        return output

    def _advance(self, request: Request, count: int) -> None:
        """Count a scheduled step's tokens as computed (drafts included, until their
        check lands), and hold a placeholder for the token it samples when it reaches
        the end of the request."""
        start = request.num_computed_tokens
        self.stats.computed_prompt_tokens += max(0, min(start + count, request.num_prompt_tokens) - start)
        request.num_computed_tokens = start + count
        if request.num_computed_tokens >= request.num_tokens + request.num_output_placeholders:
            request.num_output_placeholders += 1

    def _slots(self, num_tokens: int) -> int:
        """KV slots a request computing up to `num_tokens` tokens needs: those, and the
        lookahead a draft model writes its drafts' KV into (vLLM's num_lookahead_tokens),
        within the context limit."""
        lookahead = self._speculative.num_lookahead_tokens if self._speculative is not None else 0
        if not lookahead:
            return num_tokens
        total = num_tokens + lookahead
        return total if self.max_model_len is None else min(total, max(num_tokens, self.max_model_len))

    def _speculation_on(self) -> bool:
        """Whether this step checks drafts: speculative decoding is configured and the
        batch is below its disable_by_batch_size (vLLM's: large batches are compute
        bound, so drafts that are rejected cost more than they save)."""
        config = self._speculative
        if config is None:
            return False
        return config.disable_by_batch_size is None or len(self.running) < config.disable_by_batch_size

    def _draft_limits(self, pending: list[tuple[Request, int]]) -> dict[str, int]:
        """With adaptive speculation, how many drafts each decode may check this step
        (from measured acceptance and step times); else no limit (an empty map)."""
        if self._adaptive is None:
            return {}
        return self._adaptive.draft_lengths(
            {request.req_id: len(request.spec_token_ids) for request, to_compute in pending if to_compute == 1}
        )

    def _draft_room(self, request: Request, budget: int) -> int:
        """How many drafts `request` may check this step: the step emits up to one token
        more than it accepts, so never past max_tokens, the context limit or the budget."""
        room = budget - 1
        if request.max_output_tokens is not None:
            room = min(room, request.max_output_tokens - request.num_output_tokens - 1)
        if self.max_model_len is not None:
            room = min(room, self.max_model_len - request.num_tokens - 1)
        return max(0, room)

    def _stops_when_tokens_land(self, request: Request) -> bool:
        """Whether the tokens in flight already bring `request` to max_tokens or the
        context limit: it stops when they land, so another step would compute past its end."""
        if request.num_output_placeholders == 0:
            return False
        max_tokens = request.max_output_tokens
        if max_tokens is not None and request.num_output_tokens + request.num_output_placeholders >= max_tokens:
            return True
        return (
            self.max_model_len is not None
            and request.num_tokens + request.num_output_placeholders >= self.max_model_len
        )

    def needs_landed_tokens(self) -> bool:
        """Whether the next step must wait for the results of the step in flight: a
        grammar-constrained request's token mask follows from its last sampled token,
        so async scheduling runs steps one at a time while such a request is unfinished;
        and so do speculative decoding's steps, whose drafts follow from the last tokens."""
        if self._speculative is not None and self.requests:
            return True  # the next step's drafts follow from this step's tokens
        constrained = self._structured_output
        return constrained is not None and any(constrained.is_constrained(req_id) for req_id in self.requests)

    def _grammar_bitmask(self, scheduled: dict[str, int]) -> GrammarBitmask | None:
        """The token bitmask of the constrained requests that sample this step."""
        constrained = self._structured_output
        if constrained is None:
            return None
        # A reasoning model's grammar constrains the answer: the thinking is left free.
        sampling = [
            req_id for req_id, count in scheduled.items()
            if constrained.is_constrained(req_id) and _tokens_to_compute(self.requests[req_id]) == count
            and not self.requests[req_id].is_thinking
        ]
        return constrained.grammar_bitmask(sampling) if sampling else None

    def _new_request_data(self, request: Request) -> NewRequestData:
        table = self.block_manager.block_table(request.req_id)
        self._blocks_sent[request.req_id] = len(table)
        return NewRequestData(
            req_id=request.req_id,
            prompt_token_ids=request.prompt_token_ids,
            output_token_ids=list(request.output_token_ids),
            sampling_params=request.params,
            block_ids=list(table),
            num_computed_tokens=request.num_computed_tokens,
            num_prompt_logprobs=request.params.prompt_logprobs if request.needs_prompt_logprobs else None,
            num_prompt_logprobs_done=request.num_prompt_logprobs_done,
            lora_request=request.lora_request,
        )

    def _cached_request_data(self, requests: list[Request]) -> CachedRequestData:
        data = CachedRequestData()
        for request in requests:
            table = self.block_manager.block_table(request.req_id)
            data.req_ids.append(request.req_id)
            data.new_block_ids.append(table[self._blocks_sent[request.req_id] :])
            data.num_computed_tokens.append(request.num_computed_tokens)
            self._blocks_sent[request.req_id] = len(table)
        return data

    def _admit_waiting(
        self, budget: int, scheduled: dict[str, int], batch: list[Request], admitted: list[Request]
    ) -> int:
        """Move waiting requests to running, in policy order, while budgets and blocks
        allow; returns the token budget left."""
        index = 0
        admits = self.policy.admission(self.running, self.waiting)
        while index < len(self.waiting) and budget > 0 and len(self.running) < self.max_num_seqs:
            request = self.waiting[index]
            # A preempted request resumes once its last step's token has landed (the
            # runner is sent its tokens in full).
            if (request.num_output_placeholders or self._waits_for_sibling(request) or not admits(request)
                    or not self._lora_fits(request) or not self._tenant_thinking_fits(request)):
                index += 1
                continue
            # A request holding blocks here has had its asynchronous load: they hold its
            # computed tokens.
            resumed = bool(self.block_manager.block_table(request.req_id))
            if resumed:
                computed, cached, external, load_async = request.num_computed_tokens, [], 0, False
            else:
                # At least the last token is always computed: its logits are needed.
                cached = (
                    []
                    if request.needs_prompt_logprobs
                    else self.block_manager.find_cached_prefix(
                        request.token_ids, request.num_tokens - 1, request.chain_root
                    )
                )
                computed = len(cached) * self.block_manager.block_size
                transfer = self._transfer_request(request, None)
                external, load_async = self._external_tokens(request, transfer, computed)
            # A request that loads asynchronously gets the blocks its load fills, no more.
            count = 0 if load_async else min(request.num_tokens - computed - external, budget)
            slots = computed + external if load_async else self._slots(computed + external + count)
            if not self.block_manager.allocate(request.req_id, slots, cached):
                break
            if self.kv_connector is not None and not resumed:
                self.kv_connector.update_state_after_alloc(
                    transfer, self.block_manager.block_table(request.req_id), computed, external
                )
            computed += external
            del self.waiting[index]
            if request.num_output_tokens == 0:
                request.num_cached_tokens = computed
            if not request.was_scheduled:
                request.was_scheduled = True
                queue_time = self._clock() - request.arrival_time
                self.stats.lane_queue_time.setdefault(self.policy.lane(request), LatencyHistogram()).observe(queue_time)
            # Admission starts from the cached prefix (a preemption reset it to 0).
            request.num_computed_tokens = computed
            if load_async:
                request.status = RequestStatus.WAITING_FOR_REMOTE_KVS
                self._loading[request.req_id] = request
                continue
            request.status = RequestStatus.RUNNING
            self.running.append(request)
            scheduled[request.req_id] = count
            batch.append(request)
            admitted.append(request)
            budget -= count
        return budget

    def unload_lora(self, lora_int_id: int) -> None:
        """Tell the workers, with the next step, that adapter `lora_int_id` was unloaded."""
        self._unloaded_lora_ids.add(lora_int_id)

    def _lora_fits(self, request: Request) -> bool:
        """Whether `request`'s adapter can run beside the running requests' without
        more distinct adapters than the workers have device slots."""
        if not request.lora_int_id:
            return True
        running = {r.lora_int_id for r in self.running if r.lora_int_id}
        return request.lora_int_id in running or len(running) < self.max_loras

    def _tenant_thinking_fits(self, request: Request) -> bool:
        """Whether `request`'s remaining thinking budget fits its tenant's cap beside
        what the tenant's running requests that still think hold. One past the cap
        alone is admitted when none of its tenant's others is thinking (its end marker
        not sampled yet), so it never waits forever; a request of no tenant, or done thinking, always fits."""
        cap = self.max_thinking_tokens_per_tenant
        wanted = request.remaining_thinking_budget
        if cap is None or request.tenant is None or not wanted:
            return True
        held = [r.remaining_thinking_budget for r in self.running if r.tenant == request.tenant and r.is_thinking]
        return not held or sum(held) + wanted <= cap

    def _external_tokens(
        self, request: Request, transfer: TransferRequest | None, num_computed: int
    ) -> tuple[int, bool]:
        """Tokens after the `num_computed` cached ones that the KV connector loads
        instead of the step computing them (0 without a connector, or after a failed
        load of them), and whether it loads them asynchronously."""
        if self.kv_connector is None or request.needs_prompt_logprobs or request.kv_load_failed:
            return 0, False
        external, load_async = self.kv_connector.get_num_new_matched_tokens(transfer, num_computed)
        # The last token is always computed: its logits sample the next one.
        external = max(0, min(external, request.num_tokens - 1 - num_computed))
        return external, load_async and external > 0

    def _transfer_request(self, request: Request, keys: Sequence[BlockKey] | None) -> TransferRequest | None:
        """What the KV connector sees of `request` (plain data, never the Request), with
        `keys` as its block keys when the connector reads them (None: those of its known
        tokens but the last, for matching); None without a connector."""
        if self.kv_connector is None:
            return None
        if not self.kv_connector.uses_block_keys:
            keys = ()
        elif keys is None:
            keys = self.block_manager.chain_keys(request.token_ids, request.num_tokens - 1, request.chain_root)
        return TransferRequest(request.req_id, request.prompt_token_ids, request.kv_transfer_params,
                               request.num_tokens, tuple(keys), request.finish_reason)

    def _kv_connector_metadata(self, batch: list[Request], scheduled: dict[str, int]) -> KVConnectorMetadata | None:
        """This step's KV loads and saves (None without a connector); call before the
        step's tokens count as computed."""
        if self.kv_connector is None:
            return None
        return self.kv_connector.build_connector_meta([
            ScheduledChunk(
                self._transfer_request(request, self.block_manager.registered_keys(request.req_id)),
                self.block_manager.block_table(request.req_id),
                request.num_computed_tokens, scheduled[request.req_id],
            )
            for request in batch
        ])

    def _waits_for_sibling(self, request: Request) -> bool:
        """n > 1: a sample waits while its sibling computes the shared prompt, then
        reuses the sibling's cached prompt blocks instead of computing them again."""
        source = request.prompt_source
        return (
            source is not None
            and self.block_manager.enable_prefix_caching
            and source.status is RequestStatus.RUNNING
            and source.num_computed_tokens < source.num_prompt_tokens
        )

    def _preemption_victim(self) -> Request:
        """The running request to preempt when blocks run out: of the policy's highest
        preemption class, the one cheapest to rebuild, then the last in policy order."""
        policy = self.policy
        return max(self.running, key=lambda r: (policy.preemption_class(r), -self.rebuild_cost(r), self.order_key(r)))

    def rebuild_cost(self, request: Request) -> int:
        """Tokens a preemption of running `request` would have to recompute: its
        computed ones but the leading full blocks that survive it, those another
        request also holds (they stay in the prefix cache) and those the KV
        connector's store holds (the CPU tier: loaded back, a swap-in, instead of
        recomputed). So a short context is cheap to recompute, and a long one whose
        blocks the tier holds is cheap to swap back."""
        manager, connector = self.block_manager, self.kv_connector
        table, keys = manager.block_table(request.req_id), manager.registered_keys(request.req_id)
        kept = 0
        for block, key in zip(table, keys):
            if manager.ref_counts[block] < 2 and (connector is None or not connector.holds(key)):
                break
            kept += 1
        return max(0, request.num_computed_tokens - kept * manager.block_size)

    def _preempt(self, request: Request, reason: str) -> None:
        self.stats.num_preemptions += 1
        self.stats.preemptions_by_reason[reason] = self.stats.preemptions_by_reason.get(reason, 0) + 1
        self.running.remove(request)
        self.block_manager.free(request.req_id, session_id=request.session_id)
        # The runner drops a preempted request; it comes back as a new one.
        self._blocks_sent.pop(request.req_id, None)
        request.num_computed_tokens = 0
        request.spec_token_ids = []
        self._queue(request)

    # -- applying a step's results -----------------------------------------------------
    def update_from_output(
        self, step: SchedulerOutput, result: ModelRunnerOutput, step_seconds: float | None = None
    ) -> list[RequestUpdate]:
        """Apply a step's results: count prompt logprobs, put the sampled tokens in
        place of their placeholders, stop and free the requests that must stop
        (check_stop, or a complete grammar). Results of requests that ended since the
        step was scheduled are dropped. Returns an update for every request the step
        touched (with or without new tokens), in batch order. `step_seconds`, the step's
        measured run time where the engine timed it alone, feeds adaptive speculation."""
        if self._adaptive is not None and step_seconds is not None:
            self._observe_step_time(step, step_seconds)
        updates = {
            req_id: RequestUpdate(req_id, num_cached_tokens=self.requests[req_id].num_cached_tokens)
            for req_id in step.num_scheduled_tokens
            if req_id in self.requests
        }
        self._roll_back_rejected(step.scheduled_spec_decode_tokens, result, updates)
        for req_id, entries in result.prompt_logprobs.items():
            request = self.requests.get(req_id)
            if request is not None and request.wants_prompt_logprobs:
                request.num_prompt_logprobs_done += len(entries)
                updates[req_id].new_prompt_logprobs = entries
        for req_id, token, logprob, top in zip(
            result.req_ids, result.sampled_token_ids, result.logprobs, result.top_logprobs
        ):
            request = self.requests.get(req_id)
            if request is not None:
                self._append(request, token, logprob, top, updates[req_id])
        for req_id, proposal in result.draft_token_ids.items():
            request = self.requests.get(req_id)
            if request is not None:
                request.spec_token_ids = proposal
        self.stats.num_steps += 1
        self.stats.observe_iteration(step.total_num_scheduled_tokens)
        self._update_gauges()
        return list(updates.values())

    def _roll_back_rejected(
        self, drafts: dict[str, list[int]], result: ModelRunnerOutput, updates: dict[str, RequestUpdate]
    ) -> None:
        """Count the checked drafts, and take the rejected ones back out of each
        request's computed tokens: their KV slots are written over by the next step
        (the blocks stay the request's, as in vLLM, until it ends or is preempted)."""
        if not drafts:
            return
        emitted = Counter(result.req_ids)
        for req_id, proposal in drafts.items():
            request = self.requests.get(req_id)
            if request is None or not emitted[req_id]:
                continue
            accepted = emitted[req_id] - 1
            request.num_computed_tokens -= len(proposal) - accepted
            self.stats.observe_drafts(len(proposal), accepted)
            if self._adaptive is not None:
                self._adaptive.observe_check(req_id, len(proposal), accepted)
            updates[req_id].num_draft_tokens = len(proposal)
            updates[req_id].num_accepted_tokens = accepted

    def _observe_step_time(self, step: SchedulerOutput, seconds: float) -> None:
        """Report a step of decodes only (each its token and its drafts) to adaptive
        speculation; a step with prompt tokens says nothing of a decode step's cost."""
        drafts = step.scheduled_spec_decode_tokens
        decodes_only = not step.scheduled_new_reqs and all(
            count == 1 + len(drafts.get(req_id, ())) for req_id, count in step.num_scheduled_tokens.items()
        )
        if decodes_only and step.num_scheduled_tokens:
            num_drafts = sum(len(proposal) for proposal in drafts.values())
            self._adaptive.observe_step(len(step.num_scheduled_tokens), num_drafts, seconds)

    def _append(
        self, request: Request, token: int, logprob: float | None, top: dict[int, Logprob] | None, update: RequestUpdate
    ) -> None:
        if request.num_output_tokens == 0 and request.index == 0:
            self.stats.prompt_tokens += request.num_prompt_tokens
        self.stats.generation_tokens += 1
        if request.lora_request is not None:
            counts = self.stats.lora_generation_tokens
            counts[request.lora_request.lora_name] = counts.get(request.lora_request.lora_name, 0) + 1
        request.num_output_placeholders = max(0, request.num_output_placeholders - 1)
        request.append_token(token)
        update.new_token_ids.append(token)
        update.new_logprobs.append(logprob)
        update.new_top_logprobs.append(top)
        decision = check_stop(request, self.max_model_len, self.eos_token_ids)
        # A reasoning model's grammar reads the answer: thinking tokens pass it by.
        grammar_complete = (
            self._structured_output is not None
            and not request.last_token_thought
            and self._structured_output.accept(request.req_id, token)
        )
        if decision is None and grammar_complete:
            decision = "stop", None  # the grammar admits nothing more
        if decision is not None:
            update.kv_transfer_params = self._finish(request, *decision)
            update.finish_reason, update.stop_reason = decision

    def _update_gauges(self) -> None:
        stats, manager = self.stats, self.block_manager
        stats.num_running = len(self.running)
        stats.num_waiting = len(self.waiting)
        stats.max_lora = self.max_loras
        stats.running_lora_adapters = _adapter_names(self.running)
        stats.waiting_lora_adapters = _adapter_names(self.waiting)
        stats.kv_blocks_used = manager.num_used_blocks
        stats.prefix_cache_queries = manager.counters.queries
        stats.prefix_cache_hits = manager.counters.hits


def _adapter_names(requests: Iterable[Request]) -> tuple[str, ...]:
    """The LoRA adapters `requests` run under, by name, sorted (the base model left out)."""
    return tuple(sorted({r.lora_request.lora_name for r in requests if r.lora_request is not None}))


def _tokens_to_compute(request: Request) -> int:
    """Tokens of `request` no scheduled step computes yet: known ones past its computed
    count, and the placeholders of tokens being sampled."""
    return request.num_tokens + request.num_output_placeholders - request.num_computed_tokens
