"""`POST /v1/chat/completions`: a conversation, rendered by the model's chat template,
to assistant messages (text or tool calls), whole or streamed as server-sent events."""

from __future__ import annotations

from collections.abc import AsyncIterator, Sequence

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
    FunctionDefinition,
    NamedToolChoice,
    ToolCall,
    Usage,
    random_id,
)
from .reasoning import ServedReasoning, refuse_reasoning_fields
from .reasoning_parsers import ReasoningParser, ReasoningSplit
from .request_stream import RequestStream, abort_all
from .serving import OpenAIServing, prompt_logprobs_of, refuse_unsupported, usage_of
from .streaming import DeltaTracker, SampleDelta, sse_stream, whole
from .tool_parsers import ToolCallDelta, ToolParser

#: Fields OpenAI defines that accord does not implement (refused, never ignored).
UNSUPPORTED_FIELDS = ("functions", "function_call", "modalities")


class ChatService:
    """Serves chat completions over the shared serving logic."""

    def __init__(
        self,
        serving: OpenAIServing,
        tool_parser: type[ToolParser],
        reasoning: ServedReasoning | None = None,
        prompt_tokens_details: bool | None = None,
    ) -> None:
        self.serving = serving
        self.tool_parser = tool_parser
        #: The tokenizer's added tokens (text to id), which some formats are told apart by.
        self.added_tokens = serving.engine.tokenizer.added_tokens()
        tool_parser.check_tokenizer(self.added_tokens)
        #: The reasoning model's parser and budgets (--reasoning-parser), if any.
        self.reasoning = reasoning
        #: Whether usage counts the prompt tokens found in the prefix cache (the server's
        #: --enable-prompt-tokens-details unless the caller says: the Responses API always does).
        self.prompt_tokens_details = (
            serving.options.enable_prompt_tokens_details if prompt_tokens_details is None else prompt_tokens_details
        )

    async def create(self, request: ChatCompletionRequest) -> ChatCompletionResponse | StreamingResponse:
        """Answer one chat completions request."""
        answer = await self.answer(request)
        if isinstance(answer, ChatCompletionResponse):
            return answer
        return StreamingResponse(sse_stream(answer), media_type="text/event-stream")

    async def answer(self, request: ChatCompletionRequest) -> ChatCompletionResponse | AsyncIterator[ChatCompletionChunk]:
        """One chat completions request's response, or with `stream` its chunks (which
        raise a failure after the first; closing them aborts the engine request). The
        Responses API is served through this too."""
        serving = self.serving
        lora_request = serving.check_model(request.model)
        refuse_unsupported(request, UNSUPPORTED_FIELDS)
        serving.check_stream_options(request)
        if request.top_logprobs is not None and not request.logprobs:
            raise OpenAIError("top_logprobs needs logprobs=true", param="top_logprobs")
        tool_choice = self._tool_choice(request)
        if tool_choice == "auto" and not serving.options.enable_auto_tool_choice:
            raise OpenAIError('tool_choice "auto" is off on this server (--disable-auto-tool-choice)',
                              param="tool_choice")
        tools = request.tools if tool_choice != "none" else None
        exclude = tool_choice == "none" and serving.options.exclude_tools_when_tool_choice_none
        template_kwargs = dict(request.chat_template_kwargs or {})
        if request.documents is not None:
            template_kwargs["documents"] = request.documents
        rendered = serving.truncate(await serving.render_chat(
            request.messages, request.add_generation_prompt, None if exclude else request.tools,
            continue_final_message=request.continue_final_message, add_special_tokens=request.add_special_tokens,
            chat_template=request.chat_template, template_kwargs=template_kwargs,
        ), request)
        if request.max_completion_tokens is not None:
            max_tokens = serving.max_tokens(len(rendered), request.max_completion_tokens, "max_completion_tokens")
        else:
            max_tokens = serving.max_tokens(len(rendered), request.max_tokens, "max_tokens")
        prompt = list(rendered)  # once the prompt is known to fit: a long one's ids come packed
        logprobs = serving.num_logprobs(request.top_logprobs or 0, "top_logprobs") if request.logprobs else None
        constraint = serving.structured_outputs(request)
        if tools and tool_choice != "auto":
            if constraint is not None:
                raise OpenAIError("tool_choice required or named cannot be combined with response_format or guided_*",
                                  param="tool_choice")
            chosen = [t.function for t in tools if tool_choice == "required" or t.function.name == tool_choice]
            parallel = request.parallel_tool_calls and tool_choice == "required"
            constraint = StructuredOutputsParams(grammar=self._parser(chosen).grammar(parallel))
        prompt_logprobs = serving.num_logprobs(request.prompt_logprobs, "prompt_logprobs")
        reasoning = self.reasoning
        if reasoning is None:
            refuse_reasoning_fields(request)
            thinking: dict[str, object] = {}
        else:
            # The engine keeps the grammar (and the budget) to the answer by these markers.
            thinking = {"thinking_markers": reasoning.markers, "thinking_token_budget": reasoning.budget(request)}
        params = serving.sampling_params(
            request, max_tokens, logprobs, prompt_logprobs=prompt_logprobs, structured_outputs=constraint, **thinking
        )
        if tools and self.tool_parser.KEEPS_SPECIAL_TOKENS:
            params.skip_special_tokens = False  # the calls' markers are special tokens (as vLLM does)
        request_id = random_id("chatcmpl")
        streams = await serving.start([prompt], params, request_id, request.priority, lora_request,
                                      serving.affinity(request))
        fmt = serving.logprob_format(request.return_tokens_as_token_ids)
        tool_functions = [t.function for t in tools or ()]
        named = tool_choice not in ("none", "auto", "required")
        if request.stream:
            return self._chunks(request, request_id, streams[0], fmt, tool_functions, named)
        try:
            final = await streams[0].final()
        finally:
            await abort_all(streams)
        choices = []
        echo = self._echo(request)
        for sample in final.outputs:
            delta = whole(sample.index, sample)
            split = self._thinker(prompt).extract(delta.text) if reasoning else ReasoningSplit(None, delta.text)
            answer = split.content or ""
            content = echo + answer if reasoning is None or echo or answer else None
            message = ChatResponseMessage(content=content, reasoning_content=split.reasoning)
            finish_reason = delta.finish_reason
            if tool_functions:  # tool calls are read from the answer, never the thinking
                extracted = self._parser(tool_functions).extract(answer)
                if extracted.calls:
                    # parallel_tool_calls=false: the first call only, as vLLM.
                    kept = extracted.calls if request.parallel_tool_calls else extracted.calls[:1]
                    calls = [ToolCall(function=FunctionCall(name=c.name, arguments=c.arguments)) for c in kept]
                    message = ChatResponseMessage(
                        content=extracted.content, tool_calls=calls, reasoning_content=split.reasoning
                    )
                    finish_reason = _tool_finish_reason(finish_reason, named)
            logprobs = self._logprobs(delta, request, fmt)
            token_ids = delta.token_ids if request.return_token_ids else None
            choices.append(ChatChoice(
                index=delta.index, message=message, logprobs=logprobs, finish_reason=finish_reason, token_ids=token_ids
            ))
        markers = reasoning.markers if reasoning else None
        usage = usage_of([final], details=self.prompt_tokens_details, thinking_markers=markers)
        self._count_reasoning_tokens(usage, request)
        return ChatCompletionResponse(
            id=request_id, model=serving.model.name, choices=choices, usage=usage,
            prompt_logprobs=prompt_logprobs_of(final, fmt) if request.prompt_logprobs is not None else None,
            prompt_token_ids=list(final.prompt_token_ids) if request.return_token_ids else None,
            kv_transfer_params=final.kv_transfer_params,
        )

    def _parser(self, functions: Sequence[FunctionDefinition]) -> ToolParser:
        """A tool parser for one choice, knowing `functions` (the request's tools)."""
        return self.tool_parser([f.model_dump(exclude_none=True) for f in functions], self.added_tokens)

    def _thinker(self, prompt_token_ids: list[int]) -> ReasoningParser:
        """A reasoning parser for one choice of this prompt's output."""
        assert self.reasoning is not None, "only with --reasoning-parser"
        return self.reasoning.parser_for(prompt_token_ids)

    def _count_reasoning_tokens(self, usage: Usage | None, request: ChatCompletionRequest) -> None:
        """Count a finished response's thinking tokens in /metrics (and under its tenant)."""
        if usage is not None and usage.completion_tokens_details is not None:
            self.serving.metrics.reasoning_tokens(usage.completion_tokens_details.reasoning_tokens, request._tenant)

    @staticmethod
    def _echo(request: ChatCompletionRequest) -> str:
        """What vLLM's chat `echo` puts before the answer: the last message, when it is
        the assistant's (the answer continues it)."""
        last = request.messages[-1]
        return last.text() if request.echo and last.role == "assistant" else ""

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

    def _chunk(self, request_id: str, choices: list[ChatStreamChoice], **fields: object) -> ChatCompletionChunk:
        return ChatCompletionChunk(id=request_id, model=self.serving.model.name, choices=choices, **fields)

    async def _chunks(
        self,
        request: ChatCompletionRequest,
        request_id: str,
        stream: RequestStream,
        fmt: LogprobFormat,
        tool_functions: list[FunctionDefinition],
        named: bool,
    ) -> AsyncIterator[ChatCompletionChunk]:
        markers = self.reasoning.markers if self.reasoning else None
        usage = self.serving.stream_usage(request, lambda: [stream.latest], thinking_markers=markers,
                                          details=self.prompt_tokens_details)

        def chunk(choices: list[ChatStreamChoice]) -> ChatCompletionChunk:
            return self._chunk(request_id, choices, usage=usage.running())

        tracker = DeltaTracker()
        parsers = {i: self._parser(tool_functions) for i in range(request.n)} if tool_functions else {}
        prompt = stream.latest.prompt_token_ids
        thinkers = {i: self._thinker(prompt) for i in range(request.n)} if self.reasoning else {}
        num_calls = dict.fromkeys(range(request.n), 0)
        try:
            # OpenAI opens each choice with a role-only delta (vLLM's first chunk also
            # carries prompt_token_ids when asked for; echo follows it).
            opening = DeltaMessage(role="assistant", content="")
            prompt_token_ids = list(stream.latest.prompt_token_ids) if request.return_token_ids else None
            yield self._chunk(request_id, [ChatStreamChoice(index=i, delta=opening) for i in range(request.n)],
                              usage=usage.running(), prompt_token_ids=prompt_token_ids)
            if echo := self._echo(request):
                yield chunk([ChatStreamChoice(index=i, delta=DeltaMessage(content=echo)) for i in range(request.n)])
            async for output in stream:
                for sample in output.outputs:
                    delta = tracker.delta(sample.index, sample)
                    if delta is None:
                        continue
                    finish_reason = delta.finish_reason
                    thinker = thinkers.get(delta.index)
                    split = ReasoningSplit(None, delta.text)
                    if thinker is not None:
                        split = _merge(thinker.feed(delta.text), thinker.finish() if finish_reason else None)
                    text = split.content or ""
                    messages = [DeltaMessage(content=text)] if thinker is None or text else []
                    parser = parsers.get(delta.index)
                    if parser is not None:  # tool calls are read from the answer, never the thinking
                        found = parser.feed(text)
                        content, calls = found.content, found.calls
                        if delta.finish_reason is not None:  # what was held back: text, or calls
                            ended = parser.finish()
                            content, calls = content + ended.content, calls + ended.calls
                        if not request.parallel_tool_calls:  # the first call only, as vLLM
                            calls = [call for call in calls if call.index == 0]
                        messages = [DeltaMessage(content=content or None)] if content else []
                        if calls:
                            messages.append(DeltaMessage(tool_calls=_deltas(calls)))
                            num_calls[delta.index] = max(num_calls[delta.index], calls[-1].index + 1)
                        if finish_reason is not None and num_calls[delta.index]:
                            finish_reason = _tool_finish_reason(finish_reason, named)
                    if split.reasoning:
                        messages.insert(0, DeltaMessage(reasoning_content=split.reasoning))
                    logprobs = self._logprobs(delta, request, fmt)
                    if not messages and finish_reason is None and logprobs is None:
                        continue  # all held back (maybe a call): nothing to say yet
                    messages = messages or [DeltaMessage()]
                    for message in messages[:-1]:
                        yield chunk([ChatStreamChoice(index=delta.index, delta=message)])
                    choice = ChatStreamChoice(
                        index=delta.index, delta=messages[-1], logprobs=logprobs, finish_reason=finish_reason,
                        token_ids=delta.token_ids if request.return_token_ids else None,
                    )
                    yield chunk([choice])
            if usage.at_end:
                yield self._chunk(request_id, [], usage=usage.final())
        finally:
            await stream.abort()
            if self.reasoning is not None:
                self._count_reasoning_tokens(usage.final(), request)


def _merge(first: ReasoningSplit, then: ReasoningSplit | None) -> ReasoningSplit:
    """Two consecutive splits of one stream as one."""
    if then is None:
        return first
    reasoning = (first.reasoning or "") + (then.reasoning or "")
    content = (first.content or "") + (then.content or "")
    return ReasoningSplit(reasoning or None, content or None)


def _tool_finish_reason(finish_reason: str | None, named: bool) -> str | None:
    # OpenAI ends a message of calls with "tool_calls", except when one function was
    # named by tool_choice ("stop"); a call cut short by the length limit stays "length".
    if finish_reason == "stop" and not named:
        return "tool_calls"
    return finish_reason


def _deltas(calls: list[ToolCallDelta]) -> list[DeltaToolCall]:
    """Pieces of calls as OpenAI streams them, one entry per call in a chunk (as vLLM
    merges them): a call's first piece carries its id, type and name."""
    merged: dict[int, DeltaToolCall] = {}
    for call in calls:
        entry = merged.get(call.index)
        if entry is None:
            opening = call.name is not None
            merged[call.index] = DeltaToolCall(
                index=call.index, id=random_id("call") if opening else None, type="function" if opening else None,
                function=DeltaFunctionCall(name=call.name, arguments=call.arguments),
            )
        else:
            assert entry.function is not None
            entry.function.arguments = (entry.function.arguments or "") + call.arguments
    return list(merged.values())
