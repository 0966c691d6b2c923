"""Turns the scheduler's sequences into what callers see: incremental text (and stop
strings found in it), decoded logprob tokens, and cumulative RequestOutputs.

It owns the user-facing request records (prompt text, the n sequences) and each
sequence's detokenizer; it never changes a sequence itself: a stop string it finds is
handed back for the scheduler to apply.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field

from .detokenizer import Decoder, IncrementalDetokenizer
from ..outputs import CompletionOutput, Logprob, RequestOutput
from ..sched.request import Sequence
from ..stats import RequestTimes


@dataclass
class Request:
    """A user request: its prompt and the n sequences sampling it."""

    request_id: str
    prompt: str | None
    prompt_token_ids: list[int]
    seqs: list[Sequence]
    times: RequestTimes

    @property
    def finished(self) -> bool:
        return all(seq.is_finished for seq in self.seqs)


@dataclass
class _SeqText:
    """What has been detokenised of one sequence so far."""

    detokenizer: IncrementalDetokenizer | None
    num_output_tokens: int = 0
    num_prompt_logprobs: int = 0


@dataclass
class OutputProcessor:
    """Detokenises and builds outputs for the requests it was given."""

    tokenizer: Decoder
    requests: dict[str, Request] = field(default_factory=dict)
    _texts: dict[str, _SeqText] = field(default_factory=dict)

    def add(self, request: Request) -> None:
        """Track a new request (its sequences get detokenizers if they asked for text)."""
        self.requests[request.request_id] = request
        for seq in request.seqs:
            params = seq.params
            detokenizer = (
                IncrementalDetokenizer(
                    self.tokenizer,
                    seq.token_ids,
                    seq.num_prompt_tokens,
                    params.stop,  # type: ignore[arg-type]
                    params.include_stop_str_in_output,
                    params.skip_special_tokens,
                )
                if params.detokenize
                else None
            )
            self._texts[seq.seq_id] = _SeqText(detokenizer)

    def detokenize(self, seqs: Iterable[Sequence]) -> list[tuple[Sequence, str]]:
        """Decode what the sequences gained since the last call (text and logprob
        tokens); returns the sequences whose new text completed a stop string."""
        stops = []
        for seq in seqs:
            text = self._texts.get(seq.seq_id)
            if text is None or not seq.params.detokenize:
                continue
            if seq.prompt_logprobs is not None:
                for entry in seq.prompt_logprobs[max(1, text.num_prompt_logprobs) :]:
                    self._decode_logprob_tokens(entry)
                text.num_prompt_logprobs = len(seq.prompt_logprobs)
            if seq.num_output_tokens == text.num_output_tokens:
                continue
            if seq.logprobs is not None:
                for entry in seq.logprobs[text.num_output_tokens :]:
                    self._decode_logprob_tokens(entry)
            text.num_output_tokens = seq.num_output_tokens
            assert text.detokenizer is not None
            stop = text.detokenizer.update(find_stop=seq.num_output_tokens >= seq.params.min_tokens)
            if stop is not None:
                stops.append((seq, stop))
        return stops

    def _decode_logprob_tokens(self, entry: dict[int, Logprob] | None) -> None:
        for token_id, logprob in (entry or {}).items():
            logprob.decoded_token = self.tokenizer.decode([token_id])

    def make_outputs(self, seqs: Iterable[Sequence], now: float, final_only: bool = False) -> list[RequestOutput]:
        """A cumulative output for each request these sequences belong to (once each,
        in order; with `final_only` only for the finished ones); finished requests are
        reported one last time and forgotten."""
        if final_only:
            # A request is finished only once one of its sequences is.
            seqs = [seq for seq in seqs if seq.is_finished]
        requests = [self.requests.get(request_id) for request_id in dict.fromkeys(seq.request_id for seq in seqs)]
        return [
            self._output(request, now)
            for request in requests
            if request is not None and (not final_only or request.finished)
        ]

    def finish_all(self, request_ids: Iterable[str], now: float) -> list[RequestOutput]:
        """Final outputs of requests whose sequences have all been finished (aborted,
        failed) outside a step."""
        return [self._output(self.requests[rid], now) for rid in dict.fromkeys(request_ids) if rid in self.requests]

    def _output(self, request: Request, now: float) -> RequestOutput:
        finished = request.finished
        completions = [
            CompletionOutput(
                index=seq.index,
                text=self._visible_text(seq),
                token_ids=list(seq.output_token_ids),
                cumulative_logprob=seq.cumulative_logprob,
                logprobs=list(seq.logprobs) if seq.logprobs is not None else None,
                finish_reason=seq.finish_reason,
                stop_reason=seq.stop_reason,
            )
            for seq in request.seqs
        ]
        if finished:
            request.times.finished_time = now
            del self.requests[request.request_id]
            for seq in request.seqs:
                self._texts.pop(seq.seq_id, None)
        first = request.seqs[0]
        return RequestOutput(
            request_id=request.request_id,
            prompt=request.prompt,
            prompt_token_ids=request.prompt_token_ids,
            prompt_logprobs=list(first.prompt_logprobs) if first.prompt_logprobs is not None else None,
            outputs=completions,
            finished=finished,
            num_cached_tokens=first.num_cached_tokens,
            metrics=request.times,
        )

    def _visible_text(self, seq: Sequence) -> str:
        """The text reported so far (held-back stop-string candidates excluded)."""
        text = self._texts.get(seq.seq_id)
        if text is None or text.detokenizer is None:
            return ""
        return text.detokenizer.visible_text(seq.is_finished)
