"""A request as the scheduler runs it: its tokens and its progress, owned by the
scheduler alone (the engine builds one, hands it to `Scheduler.add_request` and never
touches it again; what callers see is the output processor's own copy).

A user request with n samples is n of these, sharing the prompt; each is scheduled,
preempted and finished on its own.
"""

from __future__ import annotations

import enum
import math
from dataclasses import dataclass, field
from typing import Any

from ..lora.request import LoRARequest
from ..sampling_params import SamplingParams
from ..thinking import ThinkingProgress
from .block_manager import BlockKey, chain_root


class RequestStatus(enum.Enum):
    """Where a request is in its life (the states docs/architecture.md draws)."""

    WAITING = "waiting"
    #: Blocks allocated, its KV loading from a KV connector off the step path (vLLM's
    #: state): no step computes it until the load has ended.
    WAITING_FOR_REMOTE_KVS = "waiting_for_remote_kvs"
    RUNNING = "running"
    FINISHED = "finished"


@dataclass(eq=False)
class Request:
    """One sample the scheduler runs: its tokens, progress and sampling settings.

    `num_computed_tokens` counts tokens whose KV is in the cache or being written by a
    step already scheduled (it advances when a step is scheduled); the tokens from there
    to the end of `token_ids`, plus the placeholders of tokens being sampled by steps in
    flight, are what the next steps must compute.
    """

    req_id: str
    prompt_token_ids: list[int]
    params: SamplingParams
    #: Which sample of its user request this is (0 for n=1).
    index: int = 0
    priority: int = 0
    arrival_time: float = 0.0
    #: Arrival order, the FCFS tiebreak among equal arrival times.
    arrival_order: int = 0
    #: The sibling whose prompt blocks this one waits to reuse (n > 1), if any.
    prompt_source: Request | None = None
    #: The LoRA adapter it runs under (None: the base model).
    lora_request: LoRARequest | None = None
    #: vLLM's cache_salt: only requests with the same salt share its prefix-cache blocks.
    cache_salt: str | None = None
    #: The agent session it is a turn of (its blocks outlive one-off requests' in the cache).
    session_id: str | None = None
    #: Whom it is served for (X-Tenant-Id or API key): its thinking counts to that
    #: tenant's cap (`--max-thinking-tokens-per-tenant`).
    tenant: str | None = None
    token_ids: list[int] = field(init=False)
    output_token_ids: list[int] = field(default_factory=list, init=False)
    num_computed_tokens: int = field(default=0, init=False)
    #: Tokens that scheduled steps will sample but whose results have not landed yet
    #: (vLLM's num_output_placeholders): at most one per step in flight.
    num_output_placeholders: int = field(default=0, init=False)
    #: Tokens proposed to follow the last one, for the next step to check (speculative
    #: decoding); used once, when that step is scheduled.
    spec_token_ids: list[int] = field(default_factory=list, init=False)
    #: Prompt tokens found in the prefix cache when first scheduled.
    num_cached_tokens: int = field(default=0, init=False)
    #: Whether it was ever scheduled (its queue time is observed the first time).
    was_scheduled: bool = field(default=False, init=False)
    #: Whether a KV connector's load of its KV failed: it computes its tokens from then on.
    kv_load_failed: bool = field(default=False, init=False)
    #: Prompt positions whose logprobs have come back (position 0 has none to compute).
    num_prompt_logprobs_done: int = field(default=0, init=False)
    status: RequestStatus = field(default=RequestStatus.WAITING, init=False)
    finish_reason: str | None = field(default=None, init=False)
    stop_reason: int | str | None = field(default=None, init=False)
    #: Progress through a reasoning model's thinking (None without thinking markers).
    thinking: ThinkingProgress | None = field(default=None, init=False)

    def __post_init__(self) -> None:
        self.token_ids = list(self.prompt_token_ids)
        markers = self.params.thinking_markers
        if markers is not None:
            self.thinking = ThinkingProgress.after_prompt(markers, self.prompt_token_ids,
                                                          self.params.thinking_token_budget)
        if self.wants_prompt_logprobs:
            self.num_prompt_logprobs_done = 1

    @property
    def lora_int_id(self) -> int:
        """Its adapter's id, 0 for the base model."""
        return self.lora_request.lora_int_id if self.lora_request else 0

    @property
    def chain_root(self) -> BlockKey:
        """The root of its blocks' hash chain: its adapter's, salted by its cache_salt."""
        return chain_root(self.lora_int_id, self.cache_salt)

    @property
    def kv_transfer_params(self) -> dict[str, Any] | None:
        """What the caller told the KV connector about this request (vLLM carries it in
        the sampling params' extra_args)."""
        return (self.params.extra_args or {}).get("kv_transfer_params")

    @property
    def num_tokens(self) -> int:
        return len(self.token_ids)

    @property
    def num_prompt_tokens(self) -> int:
        return len(self.prompt_token_ids)

    @property
    def num_output_tokens(self) -> int:
        return len(self.output_token_ids)

    @property
    def is_finished(self) -> bool:
        return self.status is RequestStatus.FINISHED

    @property
    def wants_prompt_logprobs(self) -> bool:
        """Prompt logprobs are the user request's, computed once, by its first sample."""
        return self.params.prompt_logprobs is not None and self.index == 0

    @property
    def needs_prompt_logprobs(self) -> bool:
        """Whether prompt logprobs were asked for and are not all computed yet (such a
        request computes its whole prompt: cached blocks would skip rows)."""
        return self.wants_prompt_logprobs and self.num_prompt_logprobs_done < self.num_prompt_tokens

    @property
    def is_thinking(self) -> bool:
        """Whether the output is inside a reasoning model's thinking."""
        return self.thinking is not None and self.thinking.thinking

    @property
    def remaining_thinking_budget(self) -> float:
        """Thinking tokens it may still take: 0 once the thinking ended (or without
        one), its budget's rest while thinking, unbounded while thinking without a budget."""
        if not self.is_thinking:
            return 0
        budget = self.thinking.budget  # type: ignore[union-attr]  # is_thinking: it has progress
        return math.inf if budget is None else max(0, budget - self.thinking.num_thinking_tokens)  # type: ignore[union-attr]

    @property
    def last_token_thought(self) -> bool:
        """Whether the last output token belongs to the thinking (its end marker included)."""
        if self.thinking is None:
            return False
        if self.thinking.thinking:
            return True
        return self.num_output_tokens <= self.thinking.answer_start  # type: ignore[operator]  # known once ended

    @property
    def max_output_tokens(self) -> int | None:
        """The most output tokens allowed: max_tokens, which with a thinking budget
        bounds the answer alone (so it starts counting where the answer starts, or at
        the latest start the budget leaves while the thinking goes on)."""
        max_tokens = self.params.max_tokens
        if max_tokens is None or self.thinking is None or self.params.thinking_token_budget is None:
            return max_tokens
        return self.thinking.answer_start + max_tokens  # type: ignore[operator]  # a budget bounds it

    def append_token(self, token_id: int) -> None:
        """Record one sampled token."""
        self.token_ids.append(token_id)
        self.output_token_ids.append(token_id)
        if self.thinking is not None:
            self.thinking.observe(self.output_token_ids)

    def finish(self, reason: str, stop_reason: int | str | None = None) -> None:
        """Mark the request finished with vLLM's finish reason (stop, length, abort, error)."""
        self.status = RequestStatus.FINISHED
        self.finish_reason = reason
        self.stop_reason = stop_reason
