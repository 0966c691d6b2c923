"""`POST /v1/chat/completions`: a conversation, rendered by the model's chat template,
to assistant messages, whole or streamed as server-sent events."""

from __future__ import annotations

from collections.abc import AsyncIterator

from fastapi.responses import StreamingResponse

from .errors import OpenAIError
from .logprobs import TokenText, chat_logprobs, token_text_function
from .protocol import (
    ChatChoice,
    ChatCompletionChunk,
    ChatCompletionRequest,
    ChatCompletionResponse,
    ChatLogprobs,
    ChatResponseMessage,
    ChatStreamChoice,
    DeltaMessage,
    random_id,
)
from .request_stream import RequestStream, abort_all
from .serving import OpenAIServing, usage_of
from .streaming import DONE_EVENT, DeltaTracker, SampleDelta, error_event, sse_event, whole


class ChatService:
    """Serves chat completions over the shared serving logic."""

    def __init__(self, serving: OpenAIServing) -> None:
        self.serving = serving

    async def create(self, request: ChatCompletionRequest) -> ChatCompletionResponse | StreamingResponse:
        """Answer one chat completions request."""
        serving = self.serving
        serving.check_model(request.model)
        if request.top_logprobs is not None and not request.logprobs:
            raise OpenAIError("top_logprobs needs logprobs=true", param="top_logprobs")
        prompt = serving.render_chat(request.messages, request.add_generation_prompt)
        if request.max_completion_tokens is not None:
            max_tokens = serving.max_tokens(len(prompt), request.max_completion_tokens, "max_completion_tokens")
        else:
            max_tokens = serving.max_tokens(len(prompt), request.max_tokens, "max_tokens")
        logprobs = (request.top_logprobs or 0) if request.logprobs else None
        params = serving.sampling_params(request, max_tokens, logprobs)
        request_id = random_id("chatcmpl")
        streams = await serving.start([prompt], params, request_id, request.priority)
        token_text = token_text_function(serving.decode_token, request.return_tokens_as_token_ids)
        if request.stream:
            events = self._stream(request, request_id, streams[0], token_text)
            return StreamingResponse(events, media_type="text/event-stream")
        try:
            final = await streams[0].final()
        finally:
            await abort_all(streams)
        choices = []
        for sample in final.outputs:
            delta = whole(sample.index, sample)
            logprobs = self._logprobs(delta, request, token_text)
            message = ChatResponseMessage(content=delta.text)
            choice = ChatChoice(index=delta.index, message=message, logprobs=logprobs, finish_reason=delta.finish_reason)
            choices.append(choice)
        return ChatCompletionResponse(id=request_id, model=serving.model.name, choices=choices, usage=usage_of([final]))

    @staticmethod
    def _logprobs(delta: SampleDelta, request: ChatCompletionRequest, token_text: TokenText) -> ChatLogprobs | None:
        if not request.logprobs or delta.logprobs is None:
            return None
        entries = chat_logprobs(delta.token_ids, delta.logprobs, request.top_logprobs or 0, token_text)
        return ChatLogprobs(content=entries)

    async def _stream(
        self, request: ChatCompletionRequest, request_id: str, stream: RequestStream, token_text: TokenText
    ) -> AsyncIterator[str]:
        model = self.serving.model.name

        def chunk(choices: list[ChatStreamChoice]) -> str:
            return sse_event(ChatCompletionChunk(id=request_id, model=model, choices=choices))

        tracker = DeltaTracker()
        try:
            # OpenAI opens each choice with a role-only delta.
            opening = DeltaMessage(role="assistant", content="")
            yield chunk([ChatStreamChoice(index=i, delta=opening) for i in range(request.n)])
            async for output in stream:
                for sample in output.outputs:
                    delta = tracker.delta(sample.index, sample)
                    if delta is not None:
                        choice = ChatStreamChoice(
                            index=delta.index, delta=DeltaMessage(content=delta.text),
                            logprobs=self._logprobs(delta, request, token_text), finish_reason=delta.finish_reason,
                        )
                        yield chunk([choice])
            if request.stream_options and request.stream_options.include_usage:
                usage = usage_of([stream.latest])
                yield sse_event(ChatCompletionChunk(id=request_id, model=model, choices=[], usage=usage))
        except Exception as error:  # the response has begun: report the failure in-band
            yield error_event(error)
        finally:
            await stream.abort()
        yield DONE_EVENT
