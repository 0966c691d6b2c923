"""What crosses from the scheduler to the workers and back each step: plain, picklable
data (ids, token ids, block ids, counts; never a live Request).

The runner keeps its own copy of every running request (a persistent batch), so a
request's prompt, settings and blocks are sent once, when it is (re)admitted; after
that a step sends only the diff: blocks newly allocated and the computed-token count.
A steady decode step is thus O(batch) ids and ints, no token lists.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from ..lora.request import LoRARequest
from ..outputs import Logprob
from ..sampling_params import SamplingParams
from ..structured_output import GrammarBitmask

if TYPE_CHECKING:
    from ..kv_transfer.base import KVConnectorMetadata


@dataclass
class NewRequestData:
    """A request the runner does not hold: admitted for the first time, or resumed after
    a preemption (which dropped the runner's copy, so everything is sent again)."""

    req_id: str
    prompt_token_ids: list[int]
    #: Tokens generated before a preemption (empty for a first admission).
    output_token_ids: list[int]
    sampling_params: SamplingParams
    block_ids: list[int]
    num_computed_tokens: int
    #: Top-N prompt logprobs the runner computes for this request (None: none), and how
    #: many prompt positions already have theirs (a resumed request skips those).
    num_prompt_logprobs: int | None = None
    num_prompt_logprobs_done: int = 0
    #: The adapter the request runs under (None: the base model).
    lora_request: LoRARequest | None = None


@dataclass
class CachedRequestData:
    """Requests the runner already holds, as diffs (parallel lists, one entry each)."""

    req_ids: list[str] = field(default_factory=list)
    #: Blocks appended to each request's table since the last step (usually none).
    new_block_ids: list[list[int]] = field(default_factory=list)
    num_computed_tokens: list[int] = field(default_factory=list)


@dataclass
class SchedulerOutput:
    """One step's work for the workers."""

    scheduled_new_reqs: list[NewRequestData]
    scheduled_cached_reqs: CachedRequestData
    #: Tokens each request computes this step; its order is the batch order.
    num_scheduled_tokens: dict[str, int]
    #: Requests that ended (finished, aborted, failed) since the last step: drop them.
    finished_req_ids: set[str] = field(default_factory=set)
    #: Requests preempted while building this step: drop them (they come back as new).
    preempted_req_ids: set[str] = field(default_factory=set)
    #: Allowed tokens of the constrained requests that sample this step (structured output).
    grammar_bitmask: GrammarBitmask | None = None
    #: Drafted tokens each speculating request computes after its last known token
    #: (vLLM's name): its count in num_scheduled_tokens is 1 + their number, and the
    #: step checks them with the rejection sampler.
    scheduled_spec_decode_tokens: dict[str, list[int]] = field(default_factory=dict)
    #: Nothing is scheduled here but another data-parallel replica computes: run one
    #: padding token through the model so this replica joins its MoE layers'
    #: expert-parallel collectives (vLLM's dummy batch).
    dummy_batch: bool = False
    #: The KV connector's loads and saves for this step (None: no connector).
    kv_connector_metadata: KVConnectorMetadata | None = None
    #: LoRA adapters unloaded since the last step: the workers free their slots and host
    #: copies once no request of the batch uses them.
    unloaded_lora_ids: frozenset[int] = frozenset()
    #: The requests to propose drafts for after this step (adaptive speculation: the
    #: next step would check no other's); None: every request that takes drafts.
    propose_for_req_ids: frozenset[str] | None = None

    @property
    def total_num_scheduled_tokens(self) -> int:
        return sum(self.num_scheduled_tokens.values())

    @property
    def is_empty(self) -> bool:
        """Nothing to compute (there may still be finished ids for the runner to drop)."""
        return not self.num_scheduled_tokens


@dataclass
class ModelRunnerOutput:
    """One step's results from the sampling rank: a token for every request that reached
    the end of its known tokens (a speculating request: its accepted drafts and the
    token after them, one entry each, consecutively), the prompt logprobs computed this
    step, and the drafts proposed for the next step."""

    #: Requests that sampled, in batch order, with their token, its logprob and (when
    #: asked) the logprob entry of top candidates.
    req_ids: list[str] = field(default_factory=list)
    sampled_token_ids: list[int] = field(default_factory=list)
    #: The logprobs are None when no request of the step asked for logprobs.
    logprobs: list[float | None] = field(default_factory=list)
    top_logprobs: list[dict[int, Logprob] | None] = field(default_factory=list)
    prompt_logprobs: dict[str, list[dict[int, Logprob]]] = field(default_factory=dict)
    #: Tokens proposed to follow each request's new tokens, for the next step to check.
    draft_token_ids: dict[str, list[int]] = field(default_factory=dict)
    #: Requests whose kept blocks a remote instance finished reading (the KV
    #: connector's finished_sending): the scheduler may free them.
    kv_finished_sending: set[str] = field(default_factory=set)
    #: Requests whose asynchronous KV load is in the cache (finished_recving), and
    #: those whose load failed, with the error's text: the scheduler queues them again.
    kv_finished_recving: set[str] = field(default_factory=set)
    kv_failed_recving: dict[str, str] = field(default_factory=dict)


@dataclass
class RequestUpdate:
    """What a step (or an abort, or a failure) did to one request, for the output
    processor (vLLM's EngineCoreOutput): plain data, never a live Request."""

    req_id: str
    new_token_ids: list[int] = field(default_factory=list)
    #: Per new token: its logprob (None when the step computed none) and its top
    #: candidates (None unless asked).
    new_logprobs: list[float | None] = field(default_factory=list)
    new_top_logprobs: list[dict[int, Logprob] | None] = field(default_factory=list)
    new_prompt_logprobs: list[dict[int, Logprob]] = field(default_factory=list)
    #: Set when the request finished (vLLM's reasons: stop, length, abort, error).
    finish_reason: str | None = None
    stop_reason: int | str | None = None
    #: Prompt tokens found in the prefix cache when it was first scheduled.
    num_cached_tokens: int = 0
    #: Drafted tokens this step checked for the request, and how many it accepted.
    num_draft_tokens: int = 0
    num_accepted_tokens: int = 0
    #: What the KV connector hands the caller when the request finished (vLLM's
    #: kv_transfer_params: where a decode instance finds the prompt's KV).
    kv_transfer_params: dict | None = None
