"""Request and sequence state, owned by the scheduler (the output processor reads it).

A request with n samples becomes n sequences that share the prompt; each sequence is
scheduled, preempted and finished on its own.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass, field

from ..outputs import Logprob, PromptLogprobs, SampleLogprobs
from ..sampling_params import SamplingParams
from ..stats import RequestTimes


class SequenceStatus(enum.Enum):
    """Where a sequence is in its life."""

    WAITING = "waiting"
    RUNNING = "running"
    FINISHED = "finished"


@dataclass(eq=False)
class Sequence:
    """One sample of a request: its tokens, progress, sampling settings and results.

    `num_computed_tokens` counts tokens whose KV is in the cache or being written by a
    step already scheduled (it advances when a step is scheduled); the tokens from there
    to the end of `token_ids`, plus the placeholders of tokens being sampled by steps in
    flight, are what the next steps must compute.
    """

    seq_id: str
    request_id: str
    index: int
    prompt_token_ids: list[int]
    params: SamplingParams
    priority: int = 0
    #: Arrival order, the FCFS tiebreak among equal arrival times.
    arrival_order: int = 0
    times: RequestTimes = field(default_factory=RequestTimes)
    #: The sibling whose prompt blocks this one waits to reuse (n > 1), if any.
    prompt_source: Sequence | None = None
    token_ids: list[int] = field(init=False)
    output_token_ids: list[int] = field(default_factory=list, init=False)
    num_computed_tokens: int = field(default=0, init=False)
    #: Tokens that scheduled steps will sample but whose results have not landed yet
    #: (vLLM's num_output_placeholders): at most one per step in flight.
    num_output_placeholders: int = field(default=0, init=False)
    #: Prompt tokens found in the prefix cache when first scheduled.
    num_cached_tokens: int = field(default=0, init=False)
    status: SequenceStatus = field(default=SequenceStatus.WAITING, init=False)
    finish_reason: str | None = field(default=None, init=False)
    stop_reason: int | str | None = field(default=None, init=False)
    #: Sum of the sampled tokens' logprobs; None unless logprobs were asked for (vLLM's
    #: convention: a greedy step without logprobs computes none).
    cumulative_logprob: float | None = field(default=None, init=False)
    logprobs: SampleLogprobs | None = field(default=None, init=False)
    prompt_logprobs: PromptLogprobs | None = field(default=None, init=False)

    def __post_init__(self) -> None:
        self.token_ids = list(self.prompt_token_ids)
        if self.params.logprobs is not None:
            self.logprobs = []
            self.cumulative_logprob = 0.0
        # Prompt logprobs are the request's, computed once by its first sample.
        if self.params.prompt_logprobs is not None and self.index == 0:
            self.prompt_logprobs = [None]

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
        return self.status is SequenceStatus.FINISHED

    @property
    def needs_prompt_logprobs(self) -> bool:
        """Whether prompt logprobs were asked for and are not all computed yet (such a
        sequence computes its whole prompt: cached blocks would skip rows)."""
        return self.prompt_logprobs is not None and len(self.prompt_logprobs) < self.num_prompt_tokens

    def append_token(self, token_id: int, logprob: float | None, top: dict[int, Logprob] | None) -> None:
        """Record one sampled token with its logprob and top candidates (both read only
        when logprobs were asked for)."""
        self.token_ids.append(token_id)
        self.output_token_ids.append(token_id)
        if self.logprobs is not None and top is not None:
            self.cumulative_logprob += logprob  # type: ignore[operator]
            self.logprobs.append(top)

    def finish(self, reason: str, stop_reason: int | str | None = None) -> None:
        """Mark the sequence finished with vLLM's finish reason (stop, length, abort, error)."""
        self.status = SequenceStatus.FINISHED
        self.finish_reason = reason
        self.stop_reason = stop_reason
