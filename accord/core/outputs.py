"""What `LLM.generate` and `AsyncLLM.generate` return, with vLLM's class and field names."""

from __future__ import annotations

from dataclasses import dataclass, field

from .stats import RequestTimes


@dataclass
class Logprob:
    """One candidate token's log probability, its rank in the row, and its text."""

    logprob: float
    rank: int | None = None
    decoded_token: str | None = None


#: Per generated token: the sampled token and the top-N candidates, by token id.
SampleLogprobs = list[dict[int, Logprob]]
#: Per prompt token (None for the first, which nothing predicts).
PromptLogprobs = list["dict[int, Logprob] | None"]


@dataclass
class CompletionOutput:
    """One of a request's n samples, cumulative so far."""

    index: int
    text: str
    token_ids: list[int]
    cumulative_logprob: float | None
    logprobs: SampleLogprobs | None
    finish_reason: str | None = None
    stop_reason: int | str | None = None

    def finished(self) -> bool:
        """Whether this sample has stopped."""
        return self.finish_reason is not None


@dataclass
class RequestOutput:
    """A request's prompt and its samples; `finished` once every sample has stopped."""

    request_id: str
    prompt: str | None
    prompt_token_ids: list[int]
    prompt_logprobs: PromptLogprobs | None
    outputs: list[CompletionOutput]
    finished: bool
    num_cached_tokens: int = 0
    metrics: RequestTimes = field(default_factory=RequestTimes)
    #: Set by a KV connector when the request finished (vLLM's): what the instance that
    #: continues it needs, such as where the prefill instance left the prompt's KV.
    kv_transfer_params: dict | None = None
