"""A Responses request as the chat endpoint's input: its items (and the stored
conversation it continues) as chat messages, its tools, tool choice, text format and
sampling fields as a streamed ChatCompletionRequest. The chat machinery then renders,
constrains, parses and generates exactly as for /v1/chat/completions."""

from __future__ import annotations

from collections.abc import Sequence

from pydantic import ValidationError

from ..errors import OpenAIError, describe_validation_errors
from ..protocol import (
    ChatCompletionRequest,
    ChatMessage,
    FunctionCall,
    FunctionDefinition,
    JsonSchemaFormat,
    NamedFunction,
    NamedToolChoice,
    ResponseFormat,
    StreamOptions,
    Tool,
    ToolCall,
)
from .protocol import (
    FunctionCallItem,
    FunctionCallOutputItem,
    InputItem,
    MessageItem,
    OutputItem,
    ReasoningItem,
    ResponsesRequest,
    TextFormat,
)

#: Fields OpenAI's Responses API defines that accord does not implement (refused, never ignored).
UNSUPPORTED_FIELDS = (
    "include", "conversation", "prompt", "max_tool_calls", "top_logprobs", "stream_options", "service_tier",
)

#: The chat field behind each Responses field, so an error the chat machinery raises
#: names the field the client sent.
_CHAT_FIELDS = {
    "max_completion_tokens": "max_output_tokens",
    "response_format": "text",
    "reasoning_effort": "reasoning",
    "messages": "input",
}


def refuse_unsupported(request: ResponsesRequest) -> None:
    """A 400 naming the first field set that this server does not implement."""
    for name in UNSUPPORTED_FIELDS:
        if getattr(request, name) not in (None, [], {}, 0):
            raise OpenAIError(f"{name} is not supported by this server", param=name, code="unsupported_parameter")
    if request.truncation != "disabled":
        raise OpenAIError('truncation "auto" is not supported by this server (a prompt too long is a 400)',
                          param="truncation", code="unsupported_parameter")


def conversation(items: Sequence[InputItem | OutputItem]) -> list[ChatMessage]:
    """Input items (or a stored response's output items) as chat messages, as vLLM reads
    them: a reasoning item's text is the `reasoning_content` of the assistant message or
    function_call that follows it (with none, an assistant message of its own); a
    function_call joins the assistant message before it as a tool call unless thinking
    came between; a function_call_output is a `tool` message; a developer message is a
    system message (as chat templates know it). Encrypted reasoning is a 400."""
    messages: list[ChatMessage] = []
    thinking: list[str] = []  # reasoning items the next assistant message takes

    def take_thinking() -> str | None:
        text = "\n\n".join(thinking) if thinking else None
        thinking.clear()
        return text

    def flush_thinking() -> None:
        if thinking:
            messages.append(ChatMessage(role="assistant", content=None, reasoning_content=take_thinking()))

    for index, item in enumerate(items):
        if isinstance(item, ReasoningItem):
            if item.encrypted_content is not None:
                raise OpenAIError(
                    f"input[{index}].encrypted_content: this server cannot read encrypted reasoning (only OpenAI can); "
                    "send the reasoning's content or summary as text instead",
                    param=f"input[{index}].encrypted_content", code="unsupported_parameter",
                )
            thinking.append(item.text())
        elif isinstance(item, FunctionCallItem):
            call = ToolCall(id=item.call_id, function=FunctionCall(name=item.name, arguments=item.arguments))
            last = messages[-1] if messages else None
            if last is not None and last.role == "assistant" and not thinking:
                last.tool_calls = [*(last.tool_calls or []), call]
            else:
                messages.append(ChatMessage(role="assistant", content=None, tool_calls=[call],
                                            reasoning_content=take_thinking()))
        elif isinstance(item, FunctionCallOutputItem):
            flush_thinking()
            messages.append(ChatMessage(role="tool", content=item.text(), tool_call_id=item.call_id))
        else:
            role = "system" if item.role == "developer" else item.role
            text = item.text() if isinstance(item, MessageItem) else "".join(part.text for part in item.content)
            if role == "assistant":
                messages.append(ChatMessage(role=role, content=text, reasoning_content=take_thinking()))
            else:
                flush_thinking()
                messages.append(ChatMessage(role=role, content=text))
    flush_thinking()
    return messages


def input_messages(request: ResponsesRequest) -> list[ChatMessage]:
    """The request's own `input` as chat messages (a string is one user message)."""
    if isinstance(request.input, str):
        return [ChatMessage(role="user", content=request.input)]
    return conversation(request.input)


def chat_request(request: ResponsesRequest, messages: list[ChatMessage]) -> ChatCompletionRequest:
    """The streamed chat request that answers `request` over `messages` (the stored
    conversation and this input); `instructions` come first as the system message (they
    are never carried over from a previous response, as OpenAI)."""
    if not messages:
        raise OpenAIError("input has no message to answer", param="input")
    system = [ChatMessage(role="system", content=request.instructions)] if request.instructions is not None else []
    tools = [
        Tool(function=FunctionDefinition(
            name=tool.name, description=tool.description, strict=tool.strict,
            **({"parameters": tool.parameters} if tool.parameters is not None else {}),
        ))
        for tool in request.tools
    ]
    choice = request.tool_choice
    tool_choice = choice if isinstance(choice, str) else NamedToolChoice(function=NamedFunction(name=choice.name))
    try:
        chat = ChatCompletionRequest(
            model=request.model, messages=[*system, *messages], stream=True,
            stream_options=StreamOptions(include_usage=True), max_completion_tokens=request.max_output_tokens,
            temperature=request.temperature, top_p=request.top_p, top_k=request.top_k, min_p=request.min_p,
            repetition_penalty=request.repetition_penalty, seed=request.seed, stop=request.stop,
            stop_token_ids=request.stop_token_ids, priority=request.priority, user=request.user,
            tools=tools or None, tool_choice=tool_choice if tools or choice != "auto" else None,
            parallel_tool_calls=request.parallel_tool_calls, response_format=_response_format(request.text.format),
            reasoning_effort=request.reasoning.effort if request.reasoning else None,
            session_id=request.prompt_cache_key,
        )
    except ValidationError as error:  # what the Responses model let through but chat's refuses
        message, param = describe_validation_errors(error.errors())
        raise OpenAIError(message, param=param) from None
    chat._tenant = request._tenant
    return chat


def _response_format(text_format: TextFormat) -> ResponseFormat | None:
    """`text.format` as chat's `response_format` (None for plain text)."""
    if text_format.type == "text":
        return None
    if text_format.type == "json_object":
        return ResponseFormat(type="json_object")
    if text_format.schema_ is None:
        raise OpenAIError("text.format json_schema needs a schema", param="text")
    return ResponseFormat(type="json_schema", json_schema=JsonSchemaFormat(
        name=text_format.name or "response", description=text_format.description, schema=text_format.schema_,
        strict=text_format.strict,
    ))


def in_responses_terms(error: OpenAIError) -> OpenAIError:
    """An error the chat machinery raised, naming the Responses field behind the chat
    field it names (max_completion_tokens is max_output_tokens here)."""
    param = _CHAT_FIELDS.get(error.param or "", error.param)
    message = error.message
    for chat_name, name in _CHAT_FIELDS.items():
        if "_" in chat_name:  # a field name, never a word of prose ("messages")
            message = message.replace(chat_name, name)
    if param == error.param and message == error.message:
        return error
    return OpenAIError(message, status_code=error.status_code, param=param, code=error.code, headers=error.headers)
