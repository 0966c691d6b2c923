"""Turns the scheduler's per-request updates into what callers see: incremental text
(and the stop strings found in it), decoded logprob tokens, and cumulative
RequestOutputs.

It owns the user-facing state of every request: the prompt, each sample's tokens,
logprobs, detokeniser and finish reason, and the request's times. It never reads or
writes the scheduler's requests: it is handed plain `RequestUpdate`s, and the samples
it finishes itself (a stop string completed) come back as ids for the scheduler to
abort (vLLM's reqs_to_abort).
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field

from ..outputs import CompletionOutput, Logprob, PromptLogprobs, RequestOutput, SampleLogprobs
from ..sampling_params import SamplingParams
from ..sched.check_stop import stopped_by_token
from ..sched.output import RequestUpdate
from ..stats import RequestTimes
from .detokenizer import Decoder, IncrementalDetokenizer


@dataclass
class _Sample:
    """One sample of a request as its caller sees it."""

    req_id: str
    index: int
    params: SamplingParams
    #: The prompt then the outputs (the detokeniser reads it).
    token_ids: list[int]
    num_prompt_tokens: int
    detokenizer: IncrementalDetokenizer | None = None
    #: Sum of the sampled tokens' logprobs; None unless logprobs were asked for (vLLM's
    #: convention: a greedy step without logprobs computes none).
    cumulative_logprob: float | None = None
    logprobs: SampleLogprobs | None = None
    finish_reason: str | None = None
    stop_reason: int | str | None = None

    @property
    def output_token_ids(self) -> list[int]:
        return self.token_ids[self.num_prompt_tokens :]

    @property
    def finished(self) -> bool:
        return self.finish_reason is not None


@dataclass
class _RequestState:
    """A user request: its prompt, its n samples and its times."""

    request_id: str
    prompt: str | None
    prompt_token_ids: list[int]
    samples: list[_Sample]
    times: RequestTimes
    prompt_logprobs: PromptLogprobs | None = None
    num_cached_tokens: int = 0
    kv_transfer_params: dict | None = None

    @property
    def finished(self) -> bool:
        return all(sample.finished for sample in self.samples)


@dataclass
class ProcessedOutputs:
    """What one batch of updates gave: the outputs to hand callers, and the samples a
    stop string finished that the scheduler must abort."""

    outputs: list[RequestOutput]
    req_ids_to_abort: list[str]


@dataclass
class OutputProcessor:
    """Detokenises and builds outputs for the requests it was given."""

    tokenizer: Decoder
    _requests: dict[str, _RequestState] = field(default_factory=dict)
    #: Sample id -> the user request it samples.
    _request_of: dict[str, _RequestState] = field(default_factory=dict)

    def __contains__(self, request_id: str) -> bool:
        return request_id in self._requests

    @property
    def num_unfinished(self) -> int:
        """How many user requests have not finished."""
        return len(self._requests)

    @property
    def request_ids(self) -> list[str]:
        """The unfinished user requests, oldest first."""
        return list(self._requests)

    def add_request(
        self,
        request_id: str,
        prompt: str | None,
        prompt_token_ids: list[int],
        samples: list[tuple[str, SamplingParams]],
        arrival_time: float,
    ) -> None:
        """Track a new request whose samples the scheduler runs under the given ids (each
        gets a detokeniser if it asked for text)."""
        state = _RequestState(request_id, prompt, prompt_token_ids, [], RequestTimes(arrival_time=arrival_time))
        for index, (req_id, params) in enumerate(samples):
            sample = _Sample(req_id, index, params, list(prompt_token_ids), len(prompt_token_ids))
            if params.detokenize:
                sample.detokenizer = IncrementalDetokenizer(
                    self.tokenizer,
                    sample.token_ids,
                    len(prompt_token_ids),
                    params.stop,  # type: ignore[arg-type]
                    params.include_stop_str_in_output,
                    params.skip_special_tokens,
                )
            if params.logprobs is not None:
                sample.logprobs, sample.cumulative_logprob = [], 0.0
            state.samples.append(sample)
            self._request_of[req_id] = state
        if samples and samples[0][1].prompt_logprobs is not None:
            state.prompt_logprobs = [None]
        self._requests[request_id] = state

    def sample_ids(self, request_ids: Iterable[str]) -> list[str]:
        """The scheduler's ids of the unfinished samples of these requests (unknown ids
        are ignored)."""
        return [
            sample.req_id
            for request_id in request_ids
            if request_id in self._requests
            for sample in self._requests[request_id].samples
            if not sample.finished
        ]

    def process(self, updates: Iterable[RequestUpdate], now: float, final_only: bool = False) -> ProcessedOutputs:
        """Apply the updates (new tokens, logprobs, finishes), decode what they add, and
        build a cumulative output for each request they touched (once each, in order;
        with `final_only` only for the finished ones: vLLM's FINAL_ONLY). Finished
        requests are reported one last time and forgotten."""
        touched: dict[str, _RequestState] = {}
        to_abort: list[str] = []
        for update in updates:
            state = self._request_of.get(update.req_id)
            if state is None:
                continue
            sample = next(s for s in state.samples if s.req_id == update.req_id)
            if sample.finished:
                continue  # finished here (a stop string) while the scheduler still ran it
            if self._apply(state, sample, update, now):
                to_abort.append(sample.req_id)
            touched[state.request_id] = state
        outputs = [
            self._output(state, now)
            for state in touched.values()
            if not final_only or state.finished
        ]
        return ProcessedOutputs(outputs, to_abort)

    def abort(self, request_ids: Iterable[str], now: float) -> list[RequestOutput]:
        """Finish the unfinished samples of these requests with finish_reason "abort"
        (the caller frees them in the scheduler); their final outputs."""
        states = [self._requests[rid] for rid in dict.fromkeys(request_ids) if rid in self._requests]
        for state in states:
            for sample in state.samples:
                if not sample.finished:
                    sample.finish_reason = "abort"
        return [self._output(state, now) for state in states]

    def _apply(self, state: _RequestState, sample: _Sample, update: RequestUpdate, now: float) -> bool:
        """Apply one update to one sample; True when a stop string finished it while the
        scheduler did not."""
        times = state.times
        if times.first_scheduled_time is None:
            times.first_scheduled_time = now
        state.num_cached_tokens = state.num_cached_tokens if sample.index else update.num_cached_tokens
        if update.kv_transfer_params is not None and sample.index == 0:
            state.kv_transfer_params = update.kv_transfer_params
        if state.prompt_logprobs is not None and sample.index == 0:
            state.prompt_logprobs.extend(update.new_prompt_logprobs)
            if sample.params.detokenize:
                for entry in update.new_prompt_logprobs:
                    self._decode_logprob_tokens(entry)
        times.num_draft_tokens += update.num_draft_tokens
        times.num_accepted_tokens += update.num_accepted_tokens
        sample.finish_reason, sample.stop_reason = update.finish_reason, update.stop_reason
        # One token at a time through the detokeniser when a step brings several (accepted
        # drafts) and stop strings may end the text: no token past the one completing a
        # stop string is kept, as when each came from its own step.
        per_token = len(update.new_token_ids) > 1 and sample.detokenizer is not None and bool(sample.params.stop)
        groups = (
            [[item] for item in zip(update.new_token_ids, update.new_logprobs, update.new_top_logprobs)]
            if per_token
            else [list(zip(update.new_token_ids, update.new_logprobs, update.new_top_logprobs))]
        )
        for group in groups:
            for token, logprob, top in group:
                self._append(state, sample, token, logprob, top, now)
            if not group or sample.detokenizer is None:
                continue
            stop = sample.detokenizer.update(find_stop=len(sample.output_token_ids) >= sample.params.min_tokens)
            # A stop string comes after a stop token and before the length limits (check_stop).
            if stop is None or stopped_by_token(sample.params, sample.output_token_ids):
                continue
            running = update.finish_reason is None or group is not groups[-1]
            sample.finish_reason, sample.stop_reason = "stop", stop
            return running
        return False

    def _append(
        self, state: _RequestState, sample: _Sample, token: int, logprob: float | None,
        top: dict[int, Logprob] | None, now: float,
    ) -> None:
        """Record one generated token of `sample` (and its logprobs, when asked)."""
        times = state.times
        if times.first_token_time is None:
            times.first_token_time = now
        times.num_generation_tokens += 1
        sample.token_ids.append(token)
        if sample.logprobs is not None and top is not None:
            sample.cumulative_logprob += logprob  # type: ignore[operator]
            sample.logprobs.append(top)
            if sample.params.detokenize:
                self._decode_logprob_tokens(top)

    def _decode_logprob_tokens(self, entry: dict[int, Logprob] | None) -> None:
        for token_id, logprob in (entry or {}).items():
            logprob.decoded_token = self.tokenizer.decode([token_id])

    def _output(self, state: _RequestState, now: float) -> RequestOutput:
        finished = state.finished
        completions = [
            CompletionOutput(
                index=sample.index,
                text=sample.detokenizer.visible_text(sample.finished) if sample.detokenizer is not None else "",
                token_ids=list(sample.output_token_ids),
                cumulative_logprob=sample.cumulative_logprob,
                logprobs=list(sample.logprobs) if sample.logprobs is not None else None,
                finish_reason=sample.finish_reason,
                stop_reason=sample.stop_reason,
            )
            for sample in state.samples
        ]
        if finished:
            state.times.finished_time = now
            del self._requests[state.request_id]
            for sample in state.samples:
                self._request_of.pop(sample.req_id, None)
        return RequestOutput(
            request_id=state.request_id,
            prompt=state.prompt,
            prompt_token_ids=state.prompt_token_ids,
            prompt_logprobs=list(state.prompt_logprobs) if state.prompt_logprobs is not None else None,
            outputs=completions,
            finished=finished,
            num_cached_tokens=state.num_cached_tokens,
            metrics=state.times,
            kv_transfer_params=state.kv_transfer_params,
        )
