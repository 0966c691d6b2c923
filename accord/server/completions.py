"""`POST /v1/completions`: prompts (text or token ids, one or many) to completions,
whole or streamed as server-sent events."""

from __future__ import annotations

from collections.abc import AsyncIterator

from fastapi.responses import StreamingResponse

from .errors import OpenAIError
from .logprobs import TokenText, completion_logprobs, token_text_function
from .protocol import CompletionChoice, CompletionRequest, CompletionResponse, random_id
from .request_stream import RequestStream, abort_all
from .serving import OpenAIServing, usage_of
from .streaming import DONE_EVENT, DeltaTracker, SampleDelta, error_event, merge_streams, sse_event, whole


class CompletionService:
    """Serves completions over the shared serving logic."""

    def __init__(self, serving: OpenAIServing) -> None:
        self.serving = serving

    async def create(self, request: CompletionRequest) -> CompletionResponse | StreamingResponse:
        """Answer one completions request."""
        serving = self.serving
        serving.check_model(request.model)
        prompts = self._prompt_token_ids(request.prompt)
        max_tokens = serving.max_tokens(max(map(len, prompts)), request.max_tokens, "max_tokens")
        params = serving.sampling_params(request, max_tokens, request.logprobs)
        request_id = random_id("cmpl")
        streams = await serving.start(prompts, params, request_id, request.priority)
        token_text = token_text_function(serving.decode_token, request.return_tokens_as_token_ids)
        if request.stream:
            events = self._stream(request, request_id, streams, token_text)
            return StreamingResponse(events, media_type="text/event-stream")
        try:
            finals = [await stream.final() for stream in streams]
        finally:
            await abort_all(streams)
        choices = [
            self._choice(whole(p * request.n + sample.index, sample), request, token_text)
            for p, output in enumerate(finals)
            for sample in output.outputs
        ]
        return CompletionResponse(id=request_id, model=serving.model.name, choices=choices, usage=usage_of(finals))

    def _prompt_token_ids(self, prompt: str | list[str] | list[int] | list[list[int]]) -> list[list[int]]:
        if isinstance(prompt, str) or (prompt and all(isinstance(item, int) for item in prompt)):
            prompt = [prompt]  # a single prompt, as text or as token ids
        if not prompt:
            raise OpenAIError("prompt must not be empty", param="prompt")
        prompts = []
        for item in prompt:
            token_ids = self.serving.encode(item) if isinstance(item, str) else list(item)
            if not token_ids:
                raise OpenAIError("a prompt must have at least one token", param="prompt")
            self.serving.check_token_ids(token_ids, "prompt")
            prompts.append(token_ids)
        return prompts

    @staticmethod
    def _choice(delta: SampleDelta, request: CompletionRequest, token_text: TokenText) -> CompletionChoice:
        logprobs = None
        if request.logprobs is not None and delta.logprobs is not None:
            logprobs = completion_logprobs(delta.token_ids, delta.logprobs, request.logprobs, token_text, delta.text_offset)
        return CompletionChoice(index=delta.index, text=delta.text, logprobs=logprobs, finish_reason=delta.finish_reason)

    async def _stream(
        self, request: CompletionRequest, request_id: str, streams: list[RequestStream], token_text: TokenText
    ) -> AsyncIterator[str]:
        model = self.serving.model.name
        tracker = DeltaTracker()
        try:
            async for p, output in merge_streams(streams):
                for sample in output.outputs:
                    delta = tracker.delta(p * request.n + sample.index, sample)
                    if delta is not None:
                        choice = self._choice(delta, request, token_text)
                        yield sse_event(CompletionResponse(id=request_id, model=model, choices=[choice]))
            if request.stream_options and request.stream_options.include_usage:
                usage = usage_of([stream.latest for stream in streams])
                yield sse_event(CompletionResponse(id=request_id, model=model, choices=[], usage=usage))
        except Exception as error:  # the response has begun: report the failure in-band
            yield error_event(error)
        finally:
            await abort_all(streams)
        yield DONE_EVENT
