"""`POST /v1/chat/completions`: a conversation, rendered by the model's chat template,
to assistant messages (text or tool calls), whole or streamed as server-sent events."""

from __future__ import annotations

from collections.abc import AsyncIterator

from fastapi.responses import StreamingResponse

from ..core.structured_output import StructuredOutputsParams
from .errors import OpenAIError
from .logprobs import LogprobFormat, chat_logprobs
from .protocol import (
    ChatChoice,
    ChatCompletionChunk,
    ChatCompletionRequest,
    ChatCompletionResponse,
    ChatLogprobs,
    ChatResponseMessage,
    ChatStreamChoice,
    DeltaFunctionCall,
    DeltaMessage,
    DeltaToolCall,
    FunctionCall,
    NamedToolChoice,
    ToolCall,
    random_id,
)
from .request_stream import RequestStream, abort_all
from .serving import OpenAIServing, refuse_unsupported, usage_of
from .streaming import DONE_EVENT, DeltaTracker, SampleDelta, error_event, sse_event, whole
from .tool_parsers import ParsedToolCall, ToolParser

#: Fields OpenAI defines that accord does not implement (refused, never ignored).
UNSUPPORTED_FIELDS = ("functions", "function_call", "modalities")


class ChatService:
    """Serves chat completions over the shared serving logic."""

    def __init__(self, serving: OpenAIServing, tool_parser: type[ToolParser]) -> None:
        self.serving = serving
        self.tool_parser = tool_parser

    async def create(self, request: ChatCompletionRequest) -> ChatCompletionResponse | StreamingResponse:
        """Answer one chat completions request."""
        serving = self.serving
        serving.check_model(request.model)
        refuse_unsupported(request, UNSUPPORTED_FIELDS)
        serving.check_stream_options(request)
        if request.top_logprobs is not None and not request.logprobs:
            raise OpenAIError("top_logprobs needs logprobs=true", param="top_logprobs")
        tool_choice = self._tool_choice(request)
        tools = request.tools if tool_choice != "none" else None
        rendered = await serving.render_chat(request.messages, request.add_generation_prompt, request.tools)
        if request.max_completion_tokens is not None:
            max_tokens = serving.max_tokens(len(rendered), request.max_completion_tokens, "max_completion_tokens")
        else:
            max_tokens = serving.max_tokens(len(rendered), request.max_tokens, "max_tokens")
        prompt = list(rendered)  # once the prompt is known to fit: a long one's ids come packed
        logprobs = (request.top_logprobs or 0) if request.logprobs else None
        constraint = serving.structured_outputs(request)
        if tools and tool_choice != "auto":
            if constraint is not None:
                raise OpenAIError("tool_choice required or named cannot be combined with response_format or guided_*",
                                  param="tool_choice")
            chosen = [t.function for t in tools if tool_choice == "required" or t.function.name == tool_choice]
            definitions = [f.model_dump(exclude_none=True) for f in chosen]
            parallel = request.parallel_tool_calls and tool_choice == "required"
            constraint = StructuredOutputsParams(grammar=self.tool_parser.grammar(definitions, parallel))
        params = serving.sampling_params(request, max_tokens, logprobs, structured_outputs=constraint)
        request_id = random_id("chatcmpl")
        streams = await serving.start([prompt], params, request_id, request.priority)
        fmt = serving.logprob_format(request.return_tokens_as_token_ids)
        parse_tools = bool(tools)
        named = tool_choice not in ("none", "auto", "required")
        if request.stream:
            events = self._stream(request, request_id, streams[0], fmt, parse_tools, named)
            return StreamingResponse(events, media_type="text/event-stream")
        try:
            final = await streams[0].final()
        finally:
            await abort_all(streams)
        choices = []
        for sample in final.outputs:
            delta = whole(sample.index, sample)
            message, finish_reason = ChatResponseMessage(content=delta.text), delta.finish_reason
            if parse_tools:
                extracted = self.tool_parser().extract(delta.text)
                if extracted.calls:
                    calls = [ToolCall(function=FunctionCall(name=c.name, arguments=c.arguments)) for c in extracted.calls]
                    message = ChatResponseMessage(content=extracted.content, tool_calls=calls)
                    finish_reason = _tool_finish_reason(finish_reason, named)
            logprobs = self._logprobs(delta, request, fmt)
            choices.append(ChatChoice(index=delta.index, message=message, logprobs=logprobs, finish_reason=finish_reason))
        return ChatCompletionResponse(id=request_id, model=serving.model.name, choices=choices, usage=usage_of([final]))

    @staticmethod
    def _tool_choice(request: ChatCompletionRequest) -> str:
        """"none", "auto", "required" or the named function; checked against `tools`."""
        choice = request.tool_choice
        if not request.tools:
            if choice not in (None, "none"):
                raise OpenAIError("tool_choice needs tools", param="tool_choice")
            return "none"
        if choice is None:
            return "auto"
        if isinstance(choice, NamedToolChoice):
            names = [tool.function.name for tool in request.tools]
            if choice.function.name not in names:
                raise OpenAIError(
                    f"tool_choice names {choice.function.name!r}, which is not among the tools ({', '.join(names)})",
                    param="tool_choice",
                )
            return choice.function.name
        return choice

    @staticmethod
    def _logprobs(delta: SampleDelta, request: ChatCompletionRequest, fmt: LogprobFormat) -> ChatLogprobs | None:
        if not request.logprobs or delta.logprobs is None:
            return None
        return ChatLogprobs(content=chat_logprobs(delta.token_ids, delta.logprobs, request.top_logprobs or 0, fmt))

    async def _stream(
        self,
        request: ChatCompletionRequest,
        request_id: str,
        stream: RequestStream,
        fmt: LogprobFormat,
        parse_tools: bool,
        named: bool,
    ) -> AsyncIterator[str]:
        model = self.serving.model.name

        def chunk(choices: list[ChatStreamChoice]) -> str:
            return sse_event(ChatCompletionChunk(id=request_id, model=model, choices=choices))

        tracker = DeltaTracker()
        parsers = {i: self.tool_parser() for i in range(request.n)} if parse_tools else {}
        num_calls = dict.fromkeys(range(request.n), 0)
        try:
            # OpenAI opens each choice with a role-only delta.
            opening = DeltaMessage(role="assistant", content="")
            yield chunk([ChatStreamChoice(index=i, delta=opening) for i in range(request.n)])
            async for output in stream:
                for sample in output.outputs:
                    delta = tracker.delta(sample.index, sample)
                    if delta is None:
                        continue
                    messages, finish_reason = [DeltaMessage(content=delta.text)], delta.finish_reason
                    parser = parsers.get(delta.index)
                    if parser is not None:
                        found = parser.feed(delta.text)
                        content, calls = found.content, found.calls
                        if delta.finish_reason is not None:
                            content += parser.finish().content
                        messages = [DeltaMessage(content=content or None)] if content else []
                        messages += [DeltaMessage(tool_calls=[d]) for d in _deltas(calls, num_calls[delta.index])]
                        num_calls[delta.index] += len(calls)
                        if finish_reason is not None and num_calls[delta.index]:
                            finish_reason = _tool_finish_reason(finish_reason, named)
                    logprobs = self._logprobs(delta, request, fmt)
                    if not messages and finish_reason is None and logprobs is None:
                        continue  # all held back (maybe a call): nothing to say yet
                    messages = messages or [DeltaMessage()]
                    for message in messages[:-1]:
                        yield chunk([ChatStreamChoice(index=delta.index, delta=message)])
                    choice = ChatStreamChoice(
                        index=delta.index, delta=messages[-1], logprobs=logprobs, finish_reason=finish_reason
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


def _tool_finish_reason(finish_reason: str | None, named: bool) -> str | None:
    # OpenAI ends a message of calls with "tool_calls", except when one function was
    # named by tool_choice ("stop"); a call cut short by the length limit stays "length".
    if finish_reason == "stop" and not named:
        return "tool_calls"
    return finish_reason


def _deltas(calls: list[ParsedToolCall], first_index: int) -> list[DeltaToolCall]:
    """Calls as OpenAI streams them: each opens with its id, type and name (arguments
    empty), then its arguments follow."""
    deltas = []
    for index, call in enumerate(calls, first_index):
        deltas.append(DeltaToolCall(
            index=index, id=random_id("call"), type="function", function=DeltaFunctionCall(name=call.name, arguments="")
        ))
        deltas.append(DeltaToolCall(index=index, function=DeltaFunctionCall(arguments=call.arguments)))
    return deltas
