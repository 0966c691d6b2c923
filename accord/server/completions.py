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
from .serving import OpenAIServing, prompt_logprobs_of, refuse_unsupported, usage_of
from .streaming import DeltaTracker, SampleDelta, merge_streams, sse_stream, whole

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
        lora_request = serving.check_model(request.model)
        refuse_unsupported(request, UNSUPPORTED_FIELDS)
        serving.check_stream_options(request)
        if request.max_tokens == 0 and not request.echo:
            raise OpenAIError("max_tokens=0 is only allowed with echo=true", param="max_tokens")
        prompts = await self._prompts(request)
        # max_tokens=0 with echo scores the prompt alone: the engine generates one token
        # (it always samples once) that the response leaves out.
        echo_only = request.max_tokens == 0
        max_tokens = serving.max_tokens(
            max(len(p.token_ids) for p in prompts), 1 if echo_only else request.max_tokens, "max_tokens"
        )
        logprobs = serving.num_logprobs(request.logprobs, "logprobs")
        # Echo with logprobs scores the prompt too; prompt_logprobs (vLLM) asks for it on its own.
        wanted = [logprobs if request.echo else None, serving.num_logprobs(request.prompt_logprobs, "prompt_logprobs")]
        prompt_logprobs = max((count for count in wanted if count is not None), default=None)
        params = serving.sampling_params(
            request, max_tokens, logprobs, prompt_logprobs=prompt_logprobs,
            structured_outputs=serving.structured_outputs(request),
        )
        request_id = random_id("cmpl")
        streams = await serving.start([p.token_ids for p in prompts], params, request_id, request.priority,
                                      lora_request, serving.affinity(request))
        formatter = serving.logprob_format(request.return_tokens_as_token_ids)
        if request.stream:
            chunks = self._chunks(request, request_id, streams, prompts, formatter, echo_only)
            return StreamingResponse(sse_stream(chunks), media_type="text/event-stream")
        try:
            finals = [await stream.final() for stream in streams]
        finally:
            await abort_all(streams)
        choices = []
        for p, output in enumerate(finals):
            for sample in output.outputs:
                delta = whole(p * request.n + sample.index, sample)
                choices.append(self._choice(delta, request, formatter, prompts[p], output, echo_only, True))
        usage = usage_of(finals, count_completion=not echo_only, details=serving.options.enable_prompt_tokens_details)
        return CompletionResponse(id=request_id, model=serving.model.name, choices=choices, usage=usage,
                                  kv_transfer_params=finals[0].kv_transfer_params)

    async def _prompts(self, request: CompletionRequest) -> list[_Prompt]:
        prompt = request.prompt
        if isinstance(prompt, str) or (prompt and all(isinstance(item, int) for item in prompt)):
            prompt = [prompt]  # type: ignore[list-item]  # a single prompt, as text or as token ids
        if not prompt:
            raise OpenAIError("prompt must not be empty", param="prompt")
        prompts = []
        for item in prompt:
            if isinstance(item, str):
                tokens = self.serving.truncate(await self.serving.tokenize(item, request.add_special_tokens), request)
                # Refused before its ids become a list: a long prompt's come packed.
                self.serving.check_prompt_fits(len(tokens), "prompt")
                prompts.append(_Prompt(item if len(tokens) else None, list(tokens)))
            else:
                token_ids = list(self.serving.truncate(item, request))  # type: ignore[arg-type]
                self.serving.check_token_ids(token_ids, "prompt")
                prompts.append(_Prompt(None, token_ids))
            if request.echo and (prompts[-1].text is None or request.truncate_prompt_tokens is not None):
                # Echo shows the prompt as the model saw it: its tokens' text, special tokens kept (as vLLM).
                prompts[-1] = _Prompt(self.serving.decode(prompts[-1].token_ids, skip_special_tokens=False),
                                      prompts[-1].token_ids)
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
        first: bool,
    ) -> CompletionChoice:
        """A choice for `delta`; `first` when it is the choice's first (the whole
        response, or a stream's first delta), which carries what belongs to the prompt:
        with echo its text and logprobs, and vLLM's prompt_logprobs and prompt_token_ids."""
        echoed = first and request.echo
        echo_text = (prompt.text or "") if echoed else ""
        text, token_ids, entries = delta.text, delta.token_ids, delta.logprobs
        finish_reason = delta.finish_reason
        if echo_only:  # the one token the engine had to generate is not part of the answer
            text, token_ids, entries = "", [], []
            finish_reason = "length" if finish_reason is not None else None
        logprobs = None
        if request.logprobs is not None and entries is not None:
            logprobs = CompletionLogprobs()
            if echoed:
                prompt_entries = output.prompt_logprobs or [None] * len(prompt.token_ids)
                completion_logprobs(logprobs, prompt.token_ids, prompt_entries, request.logprobs, fmt, 0, [])
            completion_logprobs(
                logprobs, token_ids, entries, request.logprobs, fmt, len(echo_text), delta.previous_token_ids
            )
        choice = CompletionChoice(index=delta.index, text=echo_text + text, logprobs=logprobs, finish_reason=finish_reason)
        if first and request.prompt_logprobs is not None:
            choice.prompt_logprobs = prompt_logprobs_of(output, fmt)
        if request.return_token_ids:
            choice.token_ids = token_ids
            choice.prompt_token_ids = list(output.prompt_token_ids) if first else None
        return choice

    async def _chunks(
        self,
        request: CompletionRequest,
        request_id: str,
        streams: list[RequestStream],
        prompts: list[_Prompt],
        formatter: LogprobFormat,
        echo_only: bool,
    ) -> AsyncIterator[CompletionResponse]:
        """The streamed response's chunks (`sse_stream` frames them); closing them, or a
        failure, aborts the engine requests."""
        model = self.serving.model.name
        tracker = DeltaTracker()
        started: set[int] = set()
        usage = self.serving.stream_usage(request, lambda: [stream.latest for stream in streams], not echo_only)
        try:
            async for p, output in merge_streams(streams):
                for sample in output.outputs:
                    index = p * request.n + sample.index
                    delta = tracker.delta(index, sample)
                    if delta is None:
                        continue
                    first = index not in started
                    started.add(index)
                    choice = self._choice(delta, request, formatter, prompts[p], output, echo_only, first)
                    yield CompletionResponse(id=request_id, model=model, choices=[choice], usage=usage.running())
            if usage.at_end:
                yield CompletionResponse(id=request_id, model=model, choices=[], usage=usage.final())
        finally:
            await abort_all(streams)
