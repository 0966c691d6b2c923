"""The Responses API's wire format (`POST /v1/responses`): the request, its input and
output items, the response object and the stream's events. Field names follow the
`openai` package's `openai.types.responses` (the authority the tests check against);
the request extras follow vLLM's ResponsesRequest."""

from __future__ import annotations

import uuid
from typing import Annotated, Any, Literal, Union

from pydantic import (
    BaseModel, ConfigDict, Discriminator, Field, PrivateAttr, SerializerFunctionWrapHandler, Strict, Tag,
    model_serializer,
)

from ..protocol import Int64, Text, TextObject, TokenId, now


def item_id(prefix: str) -> str:
    """A fresh id as OpenAI writes them: `resp_...`, `msg_...`, `fc_...`, `rs_...`."""
    return f"{prefix}_{uuid.uuid4().hex}"


class TextPart(BaseModel):
    """Text content of a message item: `input_text` (what a user or system says) or
    `output_text` (an assistant's earlier answer, sent back)."""

    model_config = ConfigDict(extra="allow")  # output_text carries annotations and logprobs

    type: Literal["input_text", "output_text"]
    text: Text


class MessageItem(BaseModel):
    """An input message: `{"role", "content"}` (its `type` may be left out)."""

    model_config = ConfigDict(extra="allow")

    type: Literal["message"] = "message"
    role: Literal["user", "assistant", "system", "developer"]
    content: Text | list[TextPart]
    id: str | None = None
    status: str | None = None

    def text(self) -> str:
        """The message's text, its parts concatenated."""
        return self.content if isinstance(self.content, str) else "".join(part.text for part in self.content)


class OutputText(BaseModel):
    """The text of an output message."""

    type: Literal["output_text"] = "output_text"
    text: str
    annotations: list[Any] = Field(default_factory=list)
    logprobs: list[Any] = Field(default_factory=list)


class ReasoningText(BaseModel):
    """A reasoning item's thinking text."""

    type: Literal["reasoning_text"] = "reasoning_text"
    text: Text


class SummaryText(BaseModel):
    """A part of a reasoning item's summary (OpenAI's models give a summary, not the thinking)."""

    type: Literal["summary_text"] = "summary_text"
    text: Text


ItemStatus = Literal["in_progress", "completed", "incomplete"]


class OutputMessage(BaseModel):
    """The assistant's answer as an output item."""

    id: str
    type: Literal["message"] = "message"
    role: Literal["assistant"] = "assistant"
    status: ItemStatus
    content: list[OutputText]


class FunctionCallItem(BaseModel):
    """A call the model made (output), or one sent back with the conversation (input)."""

    model_config = ConfigDict(extra="allow")

    type: Literal["function_call"] = "function_call"
    id: str | None = None
    call_id: Text
    name: Text
    arguments: Text
    status: ItemStatus | None = None


class FunctionCallOutputItem(BaseModel):
    """A function's result, answering the call `call_id` (input only)."""

    model_config = ConfigDict(extra="allow")

    type: Literal["function_call_output"]
    id: str | None = None
    call_id: Text
    output: Text | list[TextPart]
    status: ItemStatus | None = None

    def text(self) -> str:
        """The result's text, its parts concatenated."""
        return self.output if isinstance(self.output, str) else "".join(part.text for part in self.output)


class ReasoningItem(BaseModel):
    """The model's thinking (with --reasoning-parser). Sent back as input, its text is
    the `reasoning_content` of the assistant message that follows it, for the chat
    template to write or drop (`translate.conversation`)."""

    model_config = ConfigDict(extra="allow")

    type: Literal["reasoning"] = "reasoning"
    id: str | None = None
    summary: list[SummaryText] = Field(default_factory=list)
    content: list[ReasoningText] | None = None
    #: OpenAI's models' thinking, encrypted for OpenAI alone: refused as input.
    encrypted_content: str | None = None
    status: ItemStatus | None = None

    def text(self) -> str:
        """The thinking's text: its content, else its summary's paragraphs (the order
        vLLM reads them in)."""
        if self.content:
            return "".join(part.text for part in self.content)
        return "\n\n".join(part.text for part in self.summary)


def _item_type(item: Any) -> str:
    # A message may leave out its type (OpenAI's EasyInputMessage).
    value = item.get("type", "message") if isinstance(item, dict) else getattr(item, "type", "message")
    return value if value in _ITEM_TYPES else "unknown"


_ITEM_TYPES = ("message", "function_call", "function_call_output", "reasoning")

#: One item of `input`.
InputItem = Annotated[
    Union[
        Annotated[MessageItem, Tag("message")],
        Annotated[FunctionCallItem, Tag("function_call")],
        Annotated[FunctionCallOutputItem, Tag("function_call_output")],
        Annotated[ReasoningItem, Tag("reasoning")],
    ],
    Discriminator(_item_type, custom_error_type="invalid_item", custom_error_message=(
        "an input item is a message, function_call, function_call_output or reasoning item (other kinds are not "
        "supported by this server)"
    )),
]

#: One item of a response's `output`.
OutputItem = Annotated[Union[OutputMessage, FunctionCallItem, ReasoningItem], Field(discriminator="type")]


class FunctionTool(BaseModel):
    """A function the model may call, in the Responses API's flat shape."""

    type: Literal["function"]
    name: str = Field(pattern=r"^[A-Za-z0-9_-]{1,64}$")
    description: Text | None = None
    parameters: TextObject | None = None
    strict: bool | None = None


class NamedFunctionChoice(BaseModel):
    """`tool_choice: {"type": "function", "name": ...}`."""

    type: Literal["function"]
    name: str


class TextFormat(BaseModel):
    """`text.format`: plain text, any JSON object, or JSON matching a named schema."""

    model_config = ConfigDict(populate_by_name=True)

    type: Literal["text", "json_object", "json_schema"]
    name: str | None = None
    schema_: TextObject | None = Field(default=None, alias="schema")
    description: str | None = None
    strict: bool | None = None

    @model_serializer(mode="wrap")
    def _set_fields_only(self, handler: SerializerFunctionWrapHandler) -> dict[str, Any]:
        # Echoed as OpenAI does: {"type": "text"}, not a null for each json_schema field.
        return {key: value for key, value in handler(self).items() if value is not None}


class TextConfig(BaseModel):
    """`text`: the output's format."""

    format: TextFormat = Field(default_factory=lambda: TextFormat(type="text"))


class ReasoningConfig(BaseModel):
    """`reasoning`: the thinking's effort level (a budget from --reasoning-budgets)."""

    effort: Literal["low", "medium", "high"] | None = None
    summary: Any = None


#: At most 16 pairs, keys of up to 64 characters, values of up to 512 (as OpenAI).
Metadata = Annotated[dict[Annotated[str, Field(max_length=64)], Annotated[str, Field(max_length=512)]],
                     Field(max_length=16)]


class ResponsesRequest(BaseModel):
    """`POST /v1/responses`."""

    model: str | None = None
    input: Text | list[InputItem]
    instructions: Text | None = None
    previous_response_id: str | None = None
    store: bool = True
    background: bool = False
    stream: bool = False
    max_output_tokens: Annotated[int, Strict()] | None = Field(default=None, ge=1)
    temperature: float = Field(default=1.0, ge=0.0, le=2.0, allow_inf_nan=False)
    top_p: float = Field(default=1.0, gt=0.0, le=1.0, allow_inf_nan=False)
    tools: list[FunctionTool] = Field(default_factory=list)
    tool_choice: Literal["none", "auto", "required"] | NamedFunctionChoice = "auto"
    parallel_tool_calls: bool = True
    text: TextConfig = Field(default_factory=TextConfig)
    reasoning: ReasoningConfig | None = None
    metadata: Metadata | None = None
    user: str | None = None
    truncation: Literal["disabled", "auto"] = "disabled"
    #: vLLM's sampling extras, as on chat completions.
    top_k: Annotated[int, Strict()] = Field(default=0, ge=-1)
    min_p: float = Field(default=0.0, ge=0.0, le=1.0, allow_inf_nan=False)
    repetition_penalty: float = Field(default=1.0, gt=0.0, allow_inf_nan=False)
    seed: Int64 | None = None
    stop: Text | list[Text] | None = None
    stop_token_ids: list[TokenId] | None = None
    priority: Int64 = 0
    #: OpenAI fields accord does not implement: refused with a 400 naming the field.
    include: list[str] | None = None
    conversation: Any = None
    prompt: Any = None
    max_tool_calls: Any = None
    top_logprobs: Any = None
    stream_options: Any = None
    service_tier: Any = None
    #: OpenAI's cache-affinity hint: accord's agent session (the chat request's session_id).
    prompt_cache_key: str | None = Field(default=None, min_length=1)
    #: The tenant its usage counts under (request_hints.apply_header_hints), never from the body.
    _tenant: str | None = PrivateAttr(default=None)


class InputTokensDetails(BaseModel):
    """`usage.input_tokens_details`: input tokens found in the prefix cache."""

    cached_tokens: int
    #: Tokens written to an explicit prompt cache (OpenAI's prompt_cache_options): accord
    #: has none, its prefix cache is implicit.
    cache_write_tokens: int = 0


class OutputTokensDetails(BaseModel):
    """`usage.output_tokens_details`: output tokens that were thinking."""

    reasoning_tokens: int


class ResponseUsage(BaseModel):
    """A response's token counts."""

    input_tokens: int
    input_tokens_details: InputTokensDetails
    output_tokens: int
    output_tokens_details: OutputTokensDetails
    total_tokens: int


class ResponseError(BaseModel):
    """Why a response failed (status "failed")."""

    code: str
    message: str


class IncompleteDetails(BaseModel):
    """Why a response is incomplete: its output reached max_output_tokens."""

    reason: Literal["max_output_tokens"]


ResponseStatus = Literal["queued", "in_progress", "completed", "incomplete", "failed", "cancelled"]


class ResponseObject(BaseModel):
    """A `response`: the request's settings echoed, its status and output items."""

    id: str = Field(default_factory=lambda: item_id("resp"))
    object: Literal["response"] = "response"
    created_at: int = Field(default_factory=now)
    status: ResponseStatus
    model: str
    output: list[OutputItem] = Field(default_factory=list)
    instructions: str | None
    previous_response_id: str | None
    max_output_tokens: int | None
    temperature: float
    top_p: float
    tools: list[FunctionTool]
    tool_choice: Literal["none", "auto", "required"] | NamedFunctionChoice
    parallel_tool_calls: bool
    text: TextConfig
    reasoning: ReasoningConfig | None
    metadata: dict[str, str] | None
    user: str | None
    store: bool
    background: bool
    truncation: Literal["disabled", "auto"]
    usage: ResponseUsage | None = None
    error: ResponseError | None = None
    incomplete_details: IncompleteDetails | None = None


class DeletedResponse(BaseModel):
    """`DELETE /v1/responses/{id}`'s answer."""

    id: str
    object: Literal["response"] = "response"
    deleted: Literal[True] = True


# The stream's events, each with its place in the stream (`sequence_number`).


class LifecycleEvent(BaseModel):
    """The response as a whole: created, in progress, and how it ended."""

    type: Literal["response.created", "response.in_progress", "response.completed", "response.incomplete",
                  "response.failed"]
    sequence_number: int
    response: ResponseObject


class OutputItemEvent(BaseModel):
    """An output item begins (`added`, in progress) or ends (`done`, whole)."""

    type: Literal["response.output_item.added", "response.output_item.done"]
    sequence_number: int
    output_index: int
    item: OutputItem




class _ContentEvent(BaseModel):
    """An event about one content part of one output item."""

    sequence_number: int
    item_id: str
    output_index: int
    content_index: int


class ContentPartEvent(_ContentEvent):
    """A content part of an item begins (empty) or ends (whole)."""

    type: Literal["response.content_part.added", "response.content_part.done"]
    part: OutputText | ReasoningText


class OutputTextDeltaEvent(_ContentEvent):
    """More of the answer's text."""

    type: Literal["response.output_text.delta"] = "response.output_text.delta"
    delta: str
    logprobs: list[Any] = Field(default_factory=list)


class OutputTextDoneEvent(_ContentEvent):
    """The answer's whole text."""

    type: Literal["response.output_text.done"] = "response.output_text.done"
    text: str
    logprobs: list[Any] = Field(default_factory=list)


class ReasoningTextDeltaEvent(_ContentEvent):
    """More of the thinking's text."""

    type: Literal["response.reasoning_text.delta"] = "response.reasoning_text.delta"
    delta: str


class ReasoningTextDoneEvent(_ContentEvent):
    """The thinking's whole text."""

    type: Literal["response.reasoning_text.done"] = "response.reasoning_text.done"
    text: str


class ArgumentsDeltaEvent(BaseModel):
    """More of a function call's arguments."""

    type: Literal["response.function_call_arguments.delta"] = "response.function_call_arguments.delta"
    sequence_number: int
    item_id: str
    output_index: int
    delta: str


class ArgumentsDoneEvent(BaseModel):
    """A function call's whole arguments."""

    type: Literal["response.function_call_arguments.done"] = "response.function_call_arguments.done"
    sequence_number: int
    item_id: str
    output_index: int
    arguments: str


StreamEvent = Union[
    LifecycleEvent, OutputItemEvent, ContentPartEvent, OutputTextDeltaEvent, OutputTextDoneEvent,
    ReasoningTextDeltaEvent, ReasoningTextDoneEvent, ArgumentsDeltaEvent, ArgumentsDoneEvent,
]
