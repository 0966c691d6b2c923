"""`POST /v1/completions`: prompts (text or token ids, one or many) to completions,
whole or streamed as server-sent events; `echo` prefixes each choice with its prompt
and, with `logprobs`, the prompt's logprobs (what evaluation harnesses score)."""

from __future__ import annotations

from collections.abc import AsyncIterator
from dataclasses import dataclass

from fastapi.responses import StreamingResponse

from ..core.outputs import RequestOutput
from .errors import OpenAIError
from .logprobs import LogprobFormat, completion_logprobs
from .protocol import CompletionChoice, CompletionLogprobs, CompletionRequest, CompletionResponse, random_id
from .request_stream import RequestStream, abort_all
from .serving import OpenAIServing, refuse_unsupported, usage_of
from .streaming import DONE_EVENT, DeltaTracker, SampleDelta, error_event, merge_streams, sse_event, whole

#: Fields OpenAI defines that accord does not implement (refused, never ignored).
UNSUPPORTED_FIELDS = ("suffix", "best_of", "modalities")


@dataclass(frozen=True)
class _Prompt:
    """One prompt as sent (its text, when it came as text) and its token ids."""

    text: str | None
    token_ids: list[int]


class CompletionService:
    """Serves completions over the shared serving logic."""

    def __init__(self, serving: OpenAIServing) -> None:
        self.serving = serving

    async def create(self, request: CompletionRequest) -> CompletionResponse | StreamingResponse:
        """Answer one completions request."""
        serving = self.serving
        serving.check_model(request.model)
        refuse_unsupported(request, UNSUPPORTED_FIELDS)
        serving.check_stream_options(request)
        if request.max_tokens == 0 and not request.echo:
            raise OpenAIError("max_tokens=0 is only allowed with echo=true", param="max_tokens")
        prompts = await self._prompts(request.prompt, request.echo)
        # max_tokens=0 with echo scores the prompt alone: the engine generates one token
        # (it always samples once) that the response leaves out.
        echo_only = request.max_tokens == 0
        max_tokens = serving.max_tokens(
            max(len(p.token_ids) for p in prompts), 1 if echo_only else request.max_tokens, "max_tokens"
        )
        prompt_logprobs = request.logprobs if request.echo and request.logprobs is not None else None
        params = serving.sampling_params(
            request, max_tokens, request.logprobs, prompt_logprobs=prompt_logprobs,
            structured_outputs=serving.structured_outputs(request),
        )
        request_id = random_id("cmpl")
        streams = await serving.start([p.token_ids for p in prompts], params, request_id, request.priority)
        formatter = serving.logprob_format(request.return_tokens_as_token_ids)
        if request.stream:
            events = self._stream(request, request_id, streams, prompts, formatter, echo_only)
            return StreamingResponse(events, media_type="text/event-stream")
        try:
            finals = [await stream.final() for stream in streams]
        finally:
            await abort_all(streams)
        choices = []
        for p, output in enumerate(finals):
            for sample in output.outputs:
                delta = whole(p * request.n + sample.index, sample)
                choices.append(self._choice(delta, request, formatter, prompts[p], output, echo_only, request.echo))
        usage = usage_of(finals, count_completion=not echo_only)
        return CompletionResponse(id=request_id, model=serving.model.name, choices=choices, usage=usage)

    async def _prompts(self, prompt: str | list[str] | list[int] | list[list[int]], echo: bool) -> list[_Prompt]:
        if isinstance(prompt, str) or (prompt and all(isinstance(item, int) for item in prompt)):
            prompt = [prompt]  # type: ignore[list-item]  # a single prompt, as text or as token ids
        if not prompt:
            raise OpenAIError("prompt must not be empty", param="prompt")
        prompts = []
        for item in prompt:
            if isinstance(item, str):
                tokens = await self.serving.tokenize(item)
                # Refused before its ids become a list: a long prompt's come packed.
                self.serving.check_prompt_fits(len(tokens), "prompt")
                prompts.append(_Prompt(item, list(tokens)))
            else:
                token_ids = list(item)  # type: ignore[arg-type]
                self.serving.check_token_ids(token_ids, "prompt")
                # Echo shows a token prompt as its text (special tokens left out, as vLLM).
                prompts.append(_Prompt(self.serving.decode(token_ids) if echo and token_ids else None, token_ids))
            if not prompts[-1].token_ids:
                raise OpenAIError("a prompt must have at least one token", param="prompt")
        return prompts

    def _choice(
        self,
        delta: SampleDelta,
        request: CompletionRequest,
        fmt: LogprobFormat,
        prompt: _Prompt,
        output: RequestOutput,
        echo_only: bool,
        with_prompt: bool,
    ) -> CompletionChoice:
        """A choice for `delta`, beginning with the prompt (and its logprobs) when
        `with_prompt` (echo: the whole response, or a stream's first delta)."""
        echo_text = (prompt.text or "") if request.echo else ""
        text, token_ids, entries = delta.text, delta.token_ids, delta.logprobs
        finish_reason = delta.finish_reason
        if echo_only:  # the one token the engine had to generate is not part of the answer
            text, token_ids, entries = "", [], []
            finish_reason = "length" if finish_reason is not None else None
        logprobs = None
        if request.logprobs is not None and entries is not None:
            logprobs = CompletionLogprobs()
            if with_prompt:
                prompt_entries = output.prompt_logprobs or [None] * len(prompt.token_ids)
                completion_logprobs(logprobs, prompt.token_ids, prompt_entries, request.logprobs, fmt, 0, [])
            completion_logprobs(
                logprobs, token_ids, entries, request.logprobs, fmt, len(echo_text), delta.previous_token_ids
            )
        text = (echo_text if with_prompt else "") + text
        return CompletionChoice(index=delta.index, text=text, logprobs=logprobs, finish_reason=finish_reason)

    async def _stream(
        self,
        request: CompletionRequest,
        request_id: str,
        streams: list[RequestStream],
        prompts: list[_Prompt],
        formatter: LogprobFormat,
        echo_only: bool,
    ) -> AsyncIterator[str]:
        model = self.serving.model.name
        tracker = DeltaTracker()
        echoed: set[int] = set()
        try:
            async for p, output in merge_streams(streams):
                for sample in output.outputs:
                    index = p * request.n + sample.index
                    delta = tracker.delta(index, sample)
                    if delta is None:
                        continue
                    with_prompt = request.echo and index not in echoed
                    echoed.add(index)
                    choice = self._choice(delta, request, formatter, prompts[p], output, echo_only, with_prompt)
                    yield sse_event(CompletionResponse(id=request_id, model=model, choices=[choice]))
            if request.stream_options and request.stream_options.include_usage:
                usage = usage_of([stream.latest for stream in streams], count_completion=not echo_only)
                yield sse_event(CompletionResponse(id=request_id, model=model, choices=[], usage=usage))
        except Exception as error:  # the response has begun: report the failure in-band
            yield error_event(error)
        finally:
            await abort_all(streams)
        yield DONE_EVENT
