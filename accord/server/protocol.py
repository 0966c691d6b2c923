"""The OpenAI-compatible wire format: pydantic models for every request and response
body the server speaks. Field names and defaults follow the OpenAI API; the extras
follow vLLM's (vllm/entrypoints/openai/*/protocol.py): each one accord declares is
honoured, or refused with a 400 naming it, never dropped."""

from __future__ import annotations

import time
import uuid
from typing import Annotated, Any, Literal

from pydantic import AfterValidator, AliasChoices, BaseModel, ConfigDict, Field, PrivateAttr, Strict

#: OpenAI allows 4 stop sequences; accord takes more (harnesses send long lists), but
#: a bound keeps the per-token stop scan cheap.
MAX_STOP_SEQUENCES = 64
INT32_MAX = 2**31 - 1
INT64_MIN, INT64_MAX = -(2**63), 2**63 - 1


def _utf8(text: str) -> str:
    # JSON may carry lone surrogates ("\ud800"), which no tokenizer can encode.
    try:
        text.encode("utf-8")
    except UnicodeEncodeError as error:
        raise ValueError(f"the text is not valid Unicode (a lone surrogate at position {error.start})") from None
    return text


def _utf8_json(value: Any) -> Any:
    # Every string of a JSON value (keys too), walked without recursion: a client picks
    # the nesting depth.
    pending = [value]
    while pending:
        item = pending.pop()
        if isinstance(item, str):
            _utf8(item)
        elif isinstance(item, dict):
            pending.extend(item.keys())
            pending.extend(item.values())
        elif isinstance(item, list):
            pending.extend(item)
    return value


#: Text a client sends: a string that is valid Unicode (no lone surrogates). Every
#: string that reaches the tokenizer or the chat template has this type.
Text = Annotated[str, AfterValidator(_utf8)]
#: A JSON object a client sends whose strings reach the chat template (a tool's
#: parameter schema): each one valid Unicode.
TextObject = Annotated[dict[str, Any], AfterValidator(_utf8_json)]
#: A token id: a JSON integer (not a boolean, not 2.0), never negative; the
#: vocabulary bound is checked against the served model.
TokenId = Annotated[int, Strict(), Field(ge=0, le=INT64_MAX)]
#: A count or limit sent as a JSON integer that must fit in int64.
Int64 = Annotated[int, Strict(), Field(ge=INT64_MIN, le=INT64_MAX)]


def random_id(prefix: str) -> str:
    """A fresh response id such as `cmpl-3f2a...`."""
    return f"{prefix}-{uuid.uuid4().hex}"


def now() -> int:
    """Unix time in seconds, for `created` fields."""
    return int(time.time())


class StreamOptions(BaseModel):
    """`stream_options`: whether the stream ends with a usage-only chunk, and (vLLM)
    whether every chunk carries the usage so far."""

    include_usage: bool = False
    continuous_usage_stats: bool = False


class JsonSchemaFormat(BaseModel):
    """`response_format.json_schema`: a named JSON schema."""

    name: str = "response"
    description: str | None = None
    schema_: dict[str, Any] = Field(default_factory=dict, alias="schema")
    strict: bool | None = None


class ResponseFormat(BaseModel):
    """`response_format`: plain text, any JSON object, or JSON matching a schema."""

    type: Literal["text", "json_object", "json_schema"]
    json_schema: JsonSchemaFormat | None = None


class StructuredOutputs(BaseModel):
    """vLLM's `structured_outputs`: exactly one constraint on the output."""

    json_: str | dict[str, Any] | None = Field(default=None, alias="json")
    regex: Text | None = None
    choice: list[Text] | None = None
    grammar: Text | None = None
    json_object: bool | None = None


class SamplingFields(BaseModel):
    """Sampling fields shared by completions and chat completions."""

    model: str | None = None
    n: Annotated[int, Strict()] = Field(default=1, ge=1, le=128)
    stream: bool = False
    stream_options: StreamOptions | None = None
    stop: Text | Annotated[list[Text], Field(max_length=MAX_STOP_SEQUENCES)] | None = Field(
        default=None, description=f"up to {MAX_STOP_SEQUENCES} stop strings (OpenAI allows 4)"
    )
    stop_token_ids: list[TokenId] | None = Field(default=None, max_length=MAX_STOP_SEQUENCES)
    seed: Int64 | None = None
    temperature: float = Field(default=1.0, ge=0.0, le=2.0, allow_inf_nan=False)
    top_p: float = Field(default=1.0, gt=0.0, le=1.0, allow_inf_nan=False)
    top_k: Annotated[int, Strict()] = Field(default=0, ge=-1, le=INT32_MAX, description="0 or -1 disables top-k")
    min_p: float = Field(default=0.0, ge=0.0, le=1.0, allow_inf_nan=False)
    presence_penalty: float = Field(default=0.0, ge=-2.0, le=2.0, allow_inf_nan=False)
    frequency_penalty: float = Field(default=0.0, ge=-2.0, le=2.0, allow_inf_nan=False)
    repetition_penalty: float = Field(default=1.0, gt=0.0, allow_inf_nan=False)
    ignore_eos: bool = False
    min_tokens: Annotated[int, Strict()] = Field(default=0, ge=0, le=INT32_MAX)
    priority: Int64 = Field(default=0, description="with --scheduling-policy priority, lower values are served first")
    return_tokens_as_token_ids: bool | None = Field(
        default=None, description="name tokens in logprobs as 'token_id:N' (vLLM; default: --return-tokens-as-token-ids)"
    )
    return_token_ids: bool | None = Field(
        default=None, description="vLLM: each choice carries its token_ids, the response its prompt_token_ids"
    )
    prompt_logprobs: Annotated[int, Strict()] | None = Field(
        default=None, ge=-1, description="vLLM: this many top logprobs of each prompt token (-1: all)"
    )
    truncate_prompt_tokens: Annotated[int, Strict()] | None = Field(
        default=None, ge=-1, description="vLLM: keep this many prompt tokens (-1: the context length)"
    )
    truncation_side: Literal["left", "right"] | None = Field(
        default=None, description="vLLM: which end truncate_prompt_tokens cuts (default left: the last tokens stay)"
    )
    include_stop_str_in_output: bool = False
    skip_special_tokens: bool = True
    spaces_between_special_tokens: bool = True
    #: vLLM fields accord does not implement: refused with a 400 naming the field.
    logprob_token_ids: Any = None
    allowed_token_ids: Any = None
    bad_words: Any = None
    kv_transfer_params: dict[str, Any] | None = Field(
        default=None, description="vLLM: the KV connector's parameters (disaggregated prefill: do_remote_decode on "
        "the prefill instance, the prefill response's kv_transfer_params on the decode instance)"
    )
    cache_salt: str | None = Field(
        default=None, min_length=1,
        description="vLLM: salts the prefix cache's block hashes: only requests with the same salt share cached KV",
    )
    session_id: str | None = Field(
        default=None, min_length=1,
        description="the agent session this request is a turn of (or the X-Session-Id header): the session's cached "
        "KV outlives one-off requests' when the cache is tight, and the router sends its turns to one instance",
    )
    #: The tenant its usage counts under in /metrics (request_hints.tenant_from), set by
    #: the app from the headers, never from the body.
    _tenant: str | None = PrivateAttr(default=None)
    logit_bias: dict[str, float] | None = Field(
        default=None, description="token id (as a string) -> bias in [-100, 100] added to its logit"
    )
    response_format: ResponseFormat | None = None
    guided_json: str | dict[str, Any] | None = Field(default=None, description="vLLM: output matches this JSON schema")
    guided_regex: Text | None = Field(default=None, description="vLLM: output matches this regular expression")
    guided_choice: list[Text] | None = Field(default=None, description="vLLM: output is one of these strings")
    guided_grammar: Text | None = Field(default=None, description="vLLM: output matches this grammar (Lark or GBNF)")
    structured_outputs: StructuredOutputs | None = Field(default=None, description="vLLM's newer form of guided_*")
    user: str | None = None
    #: OpenAI fields accord does not implement: refused with a 400 naming the field.
    modalities: Any = None


class CompletionRequest(SamplingFields):
    """`POST /v1/completions`."""

    prompt: Text | list[Text] | list[TokenId] | list[list[TokenId]]
    max_tokens: Annotated[int, Strict()] | None = Field(default=16, ge=0, description="0 only with echo")
    logprobs: Annotated[int, Strict()] | None = Field(
        default=None, ge=-1, description="top logprobs per token (-1: all), at most --max-logprobs"
    )
    echo: bool = Field(default=False, description="prefix each choice with its prompt (and its prompt logprobs)")
    add_special_tokens: bool = True
    suffix: Any = None
    best_of: Any = None


class TextContentPart(BaseModel):
    """A `{"type": "text", "text": ...}` content part (the only kind a text model takes)."""

    type: Literal["text"]
    text: Text


class FunctionCall(BaseModel):
    """A function the model called: its name and its arguments as a JSON string."""

    name: Text
    arguments: Text


class ToolCall(BaseModel):
    """One tool call of an assistant message."""

    id: Text = Field(default_factory=lambda: random_id("call"))
    type: Literal["function"] = "function"
    function: FunctionCall


class FunctionDefinition(BaseModel):
    """A function the model may call: name, description and a JSON schema of its arguments."""

    name: str = Field(pattern=r"^[A-Za-z0-9_-]{1,64}$")
    description: Text | None = None
    parameters: TextObject = Field(default_factory=lambda: {"type": "object", "properties": {}})
    strict: bool | None = None


class Tool(BaseModel):
    """`tools[i]`: a function tool."""

    type: Literal["function"] = "function"
    function: FunctionDefinition


class NamedFunction(BaseModel):
    """The function named by `tool_choice`."""

    name: str


class NamedToolChoice(BaseModel):
    """`tool_choice: {"type": "function", "function": {"name": ...}}`."""

    type: Literal["function"] = "function"
    function: NamedFunction


class ChatMessage(BaseModel):
    """One message of a conversation; content may be a string or OpenAI text parts."""

    model_config = ConfigDict(extra="allow")

    #: OpenAI's roles, or any other the chat template knows (vLLM passes them through).
    role: Text
    content: Text | list[TextContentPart] | None = None
    name: Text | None = None
    tool_calls: list[ToolCall] | None = None
    tool_call_id: Text | None = None
    #: An assistant turn's thinking, given back (vLLM reads `reasoning` too): the chat
    #: template decides whether to write it into the prompt.
    reasoning_content: Text | None = Field(default=None, validation_alias=AliasChoices("reasoning_content", "reasoning"))

    def text(self) -> str:
        """The message's text, its parts concatenated."""
        if self.content is None or isinstance(self.content, str):
            return self.content or ""
        return "".join(part.text for part in self.content)


class ChatCompletionRequest(SamplingFields):
    """`POST /v1/chat/completions`."""

    messages: list[ChatMessage] = Field(min_length=1)
    max_tokens: Annotated[int, Strict()] | None = Field(
        default=None, ge=1, description="deprecated alias of max_completion_tokens"
    )
    max_completion_tokens: Annotated[int, Strict()] | None = Field(default=None, ge=1)
    logprobs: bool = False
    top_logprobs: Annotated[int, Strict()] | None = Field(
        default=None, ge=-1, description="top logprobs per token (-1: all), at most --max-logprobs"
    )
    add_generation_prompt: bool = True
    continue_final_message: bool = Field(
        default=False, description="vLLM: the answer continues the last message (no generation prompt)"
    )
    echo: bool = Field(default=False, description="vLLM: the answer begins with the last message when it is the "
                       "assistant's")
    add_special_tokens: bool = Field(default=False, description="vLLM: add the tokenizer's own special tokens too")
    documents: list[dict[str, Text]] | None = Field(default=None, description="vLLM: passed to the chat template")
    chat_template: Text | None = Field(default=None, description="vLLM: with --trust-request-chat-template only")
    chat_template_kwargs: TextObject | None = Field(
        default=None, description="vLLM: extra chat template variables (e.g. enable_thinking)"
    )
    reasoning_effort: Literal["low", "medium", "high"] | None = Field(
        default=None, description="the thinking budget's level (--reasoning-budgets maps each to a token count)"
    )
    thinking_token_budget: Annotated[int, Strict()] | None = Field(
        default=None, ge=0, description="thinking tokens before the end of thinking is forced (overrides "
        "reasoning_effort); max_completion_tokens then bounds the answer alone",
    )
    tools: list[Tool] | None = None
    tool_choice: Literal["none", "auto", "required"] | NamedToolChoice | None = None
    parallel_tool_calls: bool = True
    functions: Any = None
    function_call: Any = None


class PromptTokensDetails(BaseModel):
    """`usage.prompt_tokens_details`: prompt tokens served from the prefix cache."""

    cached_tokens: int


class CompletionTokensDetails(BaseModel):
    """`usage.completion_tokens_details`: generated tokens that were thinking."""

    reasoning_tokens: int


class Usage(BaseModel):
    """Token counts of one response (all choices together)."""

    prompt_tokens: int
    completion_tokens: int
    total_tokens: int
    prompt_tokens_details: PromptTokensDetails | None = None
    completion_tokens_details: CompletionTokensDetails | None = None


class PromptLogprob(BaseModel):
    """One candidate of a prompt position (vLLM's `prompt_logprobs` entries)."""

    logprob: float
    rank: int | None = None
    decoded_token: str | None = None


#: Per prompt token: candidates by token id (None for the first token).
PromptLogprobs = list[dict[int, PromptLogprob] | None]


class CompletionLogprobs(BaseModel):
    """Legacy completions logprobs: parallel lists, one entry per generated token."""

    text_offset: list[int] = Field(default_factory=list)
    token_logprobs: list[float | None] = Field(default_factory=list)
    tokens: list[str] = Field(default_factory=list)
    top_logprobs: list[dict[str, float] | None] = Field(default_factory=list)


class CompletionChoice(BaseModel):
    """One choice of a completion or of a completion stream chunk."""

    index: int
    text: str
    logprobs: CompletionLogprobs | None = None
    finish_reason: str | None = None
    prompt_logprobs: PromptLogprobs | None = None
    prompt_token_ids: list[int] | None = None
    token_ids: list[int] | None = None


class CompletionResponse(BaseModel):
    """A `text_completion` response or stream chunk (chunks carry `usage` only last)."""

    id: str
    object: Literal["text_completion"] = "text_completion"
    created: int = Field(default_factory=now)
    model: str
    choices: list[CompletionChoice]
    usage: Usage | None = None
    #: vLLM: what the KV connector hands on (a prefill instance's: where its KV is).
    kv_transfer_params: dict[str, Any] | None = None


class TopLogprob(BaseModel):
    """One alternative token with its log-probability."""

    token: str
    logprob: float
    bytes: list[int] | None = None


class TokenLogprob(TopLogprob):
    """A sampled token with its log-probability and the top alternatives."""

    top_logprobs: list[TopLogprob] = Field(default_factory=list)


class ChatLogprobs(BaseModel):
    """Chat logprobs: one entry per generated token."""

    content: list[TokenLogprob] | None = None


class ChatResponseMessage(BaseModel):
    """The assistant's message in a non-streamed chat choice."""

    role: Literal["assistant"] = "assistant"
    #: A reasoning model's thinking (with --reasoning-parser), as vLLM names it.
    reasoning_content: str | None = None
    content: str | None
    tool_calls: list[ToolCall] = Field(default_factory=list)


class ChatChoice(BaseModel):
    """One choice of a chat completion."""

    index: int
    message: ChatResponseMessage
    logprobs: ChatLogprobs | None = None
    finish_reason: str | None = None
    token_ids: list[int] | None = None


class ChatCompletionResponse(BaseModel):
    """A `chat.completion` response."""

    id: str
    object: Literal["chat.completion"] = "chat.completion"
    created: int = Field(default_factory=now)
    model: str
    choices: list[ChatChoice]
    usage: Usage
    prompt_logprobs: PromptLogprobs | None = None
    prompt_token_ids: list[int] | None = None
    #: vLLM: what the KV connector hands on (a prefill instance's: where its KV is).
    kv_transfer_params: dict[str, Any] | None = None


class DeltaFunctionCall(BaseModel):
    """A streamed piece of a function call (the name comes once, arguments in parts)."""

    name: str | None = None
    arguments: str | None = None


class DeltaToolCall(BaseModel):
    """A streamed piece of tool call `index` (`id` and `type` come with its first piece)."""

    index: int
    id: str | None = None
    type: Literal["function"] | None = None
    function: DeltaFunctionCall


class DeltaMessage(BaseModel):
    """The new part of a streamed assistant message."""

    role: Literal["assistant"] | None = None
    reasoning_content: str | None = None
    content: str | None = None
    tool_calls: list[DeltaToolCall] | None = None


class ChatStreamChoice(BaseModel):
    """One choice of a chat stream chunk."""

    index: int
    delta: DeltaMessage
    logprobs: ChatLogprobs | None = None
    finish_reason: str | None = None
    token_ids: list[int] | None = None


class ChatCompletionChunk(BaseModel):
    """A `chat.completion.chunk` stream event (the usage-only last one has no choices)."""

    id: str
    object: Literal["chat.completion.chunk"] = "chat.completion.chunk"
    created: int = Field(default_factory=now)
    model: str
    choices: list[ChatStreamChoice]
    usage: Usage | None = None
    prompt_token_ids: list[int] | None = None


class ModelCard(BaseModel):
    """One `/v1/models` entry; `description` says when the weights are random."""

    id: str
    object: Literal["model"] = "model"
    created: int = Field(default_factory=now)
    owned_by: str = "accord"
    root: str
    parent: str | None = None
    max_model_len: int
    description: str | None = None


class ModelList(BaseModel):
    """`GET /v1/models`."""

    object: Literal["list"] = "list"
    data: list[ModelCard]


class LoadLoRAAdapterRequest(BaseModel):
    """`POST /v1/load_lora_adapter` (vLLM's): serve the PEFT directory at `lora_path` as `lora_name`."""

    lora_name: str
    lora_path: str


class UnloadLoRAAdapterRequest(BaseModel):
    """`POST /v1/unload_lora_adapter` (vLLM's): stop serving adapter `lora_name`."""

    lora_name: str
    lora_int_id: int | None = None


class TokenizeRequest(BaseModel):
    """`POST /tokenize`: a prompt, or chat messages rendered by the chat template."""

    model: str | None = None
    prompt: Text | None = None
    messages: list[ChatMessage] | None = None
    add_special_tokens: bool = True
    add_generation_prompt: bool = True
    return_token_strs: bool = Field(default=False, description="vLLM: also each token's text, as token_strs")


class TokenizeResponse(BaseModel):
    """The token ids of a prompt (and, when asked, each token's text)."""

    count: int
    max_model_len: int
    tokens: list[int]
    token_strs: list[str] | None = None


class DetokenizeRequest(BaseModel):
    """`POST /detokenize`."""

    model: str | None = None
    tokens: list[TokenId]


class DetokenizeResponse(BaseModel):
    """The text of some token ids."""

    prompt: str


class HealthResponse(BaseModel):
    """`GET /health`."""

    status: Literal["ok", "error"] = "ok"


class ErrorInfo(BaseModel):
    """The inside of an OpenAI error body."""

    message: str
    type: str
    param: str | None = None
    code: int | str | None = None


class ErrorResponse(BaseModel):
    """An OpenAI error body: `{"error": {"message", "type", "param", "code"}}`."""

    error: ErrorInfo
