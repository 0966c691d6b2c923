"""The OpenAI-compatible wire format: pydantic models for every request and response
body the server speaks. Field names and defaults follow the OpenAI API; the few extras
(top_k, min_p, ignore_eos, min_tokens, repetition_penalty) follow vLLM."""

from __future__ import annotations

import time
import uuid
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

#: OpenAI caps top_logprobs at 20.
MAX_LOGPROBS = 20


def random_id(prefix: str) -> str:
    """A fresh response id such as `cmpl-3f2a...`."""
    return f"{prefix}-{uuid.uuid4().hex}"


def now() -> int:
    """Unix time in seconds, for `created` fields."""
    return int(time.time())


class StreamOptions(BaseModel):
    """`stream_options`: whether the stream ends with a usage-only chunk."""

    include_usage: bool = False


class SamplingFields(BaseModel):
    """Sampling fields shared by completions and chat completions."""

    model: str | None = None
    n: int = Field(default=1, ge=1, le=128)
    stream: bool = False
    stream_options: StreamOptions | None = None
    stop: str | list[str] | None = None
    stop_token_ids: list[int] | None = None
    seed: int | None = None
    temperature: float = Field(default=1.0, ge=0.0, le=2.0)
    top_p: float = Field(default=1.0, gt=0.0, le=1.0)
    top_k: int = Field(default=0, ge=-1, description="0 or -1 disables top-k")
    min_p: float = Field(default=0.0, ge=0.0, le=1.0)
    presence_penalty: float = Field(default=0.0, ge=-2.0, le=2.0)
    frequency_penalty: float = Field(default=0.0, ge=-2.0, le=2.0)
    repetition_penalty: float = Field(default=1.0, gt=0.0)
    ignore_eos: bool = False
    min_tokens: int = Field(default=0, ge=0)
    priority: int = Field(default=0, description="with --scheduling-policy priority, lower values are served first")
    return_tokens_as_token_ids: bool = Field(
        default=False, description="name tokens in logprobs as 'token_id:N' (vLLM's extension)"
    )
    user: str | None = None


class CompletionRequest(SamplingFields):
    """`POST /v1/completions`."""

    prompt: str | list[str] | list[int] | list[list[int]]
    max_tokens: int | None = Field(default=16, ge=1)
    logprobs: int | None = Field(default=None, ge=0, le=MAX_LOGPROBS)
    echo: Literal[False] = False


class TextContentPart(BaseModel):
    """A `{"type": "text", "text": ...}` content part (the only kind a text model takes)."""

    type: Literal["text"]
    text: str


class ChatMessage(BaseModel):
    """One message of a conversation; content may be a string or OpenAI text parts."""

    model_config = ConfigDict(extra="allow")

    role: Literal["system", "developer", "user", "assistant", "tool"]
    content: str | list[TextContentPart] | None = None
    name: str | None = None

    def text(self) -> str:
        """The message's text, its parts concatenated."""
        if self.content is None or isinstance(self.content, str):
            return self.content or ""
        return "".join(part.text for part in self.content)


class ChatCompletionRequest(SamplingFields):
    """`POST /v1/chat/completions`."""

    messages: list[ChatMessage] = Field(min_length=1)
    max_tokens: int | None = Field(default=None, ge=1, description="deprecated alias of max_completion_tokens")
    max_completion_tokens: int | None = Field(default=None, ge=1)
    logprobs: bool = False
    top_logprobs: int | None = Field(default=None, ge=0, le=MAX_LOGPROBS)
    add_generation_prompt: bool = True


class Usage(BaseModel):
    """Token counts of one response (all choices together)."""

    prompt_tokens: int
    completion_tokens: int
    total_tokens: int


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


class CompletionResponse(BaseModel):
    """A `text_completion` response or stream chunk (chunks carry `usage` only last)."""

    id: str
    object: Literal["text_completion"] = "text_completion"
    created: int = Field(default_factory=now)
    model: str
    choices: list[CompletionChoice]
    usage: Usage | None = None


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
    content: str


class ChatChoice(BaseModel):
    """One choice of a chat completion."""

    index: int
    message: ChatResponseMessage
    logprobs: ChatLogprobs | None = None
    finish_reason: str | None = None


class ChatCompletionResponse(BaseModel):
    """A `chat.completion` response."""

    id: str
    object: Literal["chat.completion"] = "chat.completion"
    created: int = Field(default_factory=now)
    model: str
    choices: list[ChatChoice]
    usage: Usage


class DeltaMessage(BaseModel):
    """The new part of a streamed assistant message."""

    role: Literal["assistant"] | None = None
    content: str | None = None


class ChatStreamChoice(BaseModel):
    """One choice of a chat stream chunk."""

    index: int
    delta: DeltaMessage
    logprobs: ChatLogprobs | None = None
    finish_reason: str | None = None


class ChatCompletionChunk(BaseModel):
    """A `chat.completion.chunk` stream event (the usage-only last one has no choices)."""

    id: str
    object: Literal["chat.completion.chunk"] = "chat.completion.chunk"
    created: int = Field(default_factory=now)
    model: str
    choices: list[ChatStreamChoice]
    usage: Usage | None = None


class ModelCard(BaseModel):
    """One `/v1/models` entry; `description` says when the weights are random."""

    id: str
    object: Literal["model"] = "model"
    created: int = Field(default_factory=now)
    owned_by: str = "accord"
    root: str
    max_model_len: int
    description: str | None = None


class ModelList(BaseModel):
    """`GET /v1/models`."""

    object: Literal["list"] = "list"
    data: list[ModelCard]


class TokenizeRequest(BaseModel):
    """`POST /tokenize`: a prompt, or chat messages rendered by the chat template."""

    model: str | None = None
    prompt: str | None = None
    messages: list[ChatMessage] | None = None
    add_special_tokens: bool = True
    add_generation_prompt: bool = True


class TokenizeResponse(BaseModel):
    """The token ids of a prompt."""

    count: int
    max_model_len: int
    tokens: list[int]


class DetokenizeRequest(BaseModel):
    """`POST /detokenize`."""

    model: str | None = None
    tokens: list[int]


class DetokenizeResponse(BaseModel):
    """The text of some token ids."""

    prompt: str


class ErrorInfo(BaseModel):
    """The inside of an OpenAI error body."""

    message: str
    type: str
    param: str | None = None
    code: int | str | None = None


class ErrorResponse(BaseModel):
    """An OpenAI error body: `{"error": {"message", "type", "param", "code"}}`."""

    error: ErrorInfo
