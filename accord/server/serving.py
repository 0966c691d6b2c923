"""What completions and chat share: the served model's identity, prompt and parameter
checks, admission control, and starting engine requests.

A request is started before the HTTP response begins: the handler waits for each
engine request's first output, so a refusal (429) or an engine failure before the first
token still gets a proper status code rather than an error inside a 200 stream.
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from dataclasses import dataclass

from jinja2.exceptions import TemplateError

from ..core.async_engine import AsyncLLM
from ..core.outputs import RequestOutput
from ..core.sampling_params import SamplingParams
from .errors import OpenAIError
from .metrics import ServerMetrics
from .protocol import ChatMessage, SamplingFields, Usage
from .request_stream import RequestStream, abort_all, engine_failure


@dataclass(frozen=True)
class ServedModel:
    """The model as the API presents it."""

    name: str
    root: str
    max_model_len: int
    vocab_size: int
    description: str | None = None


class OpenAIServing:
    """Shared serving logic over one AsyncLLM."""

    def __init__(
        self, engine: AsyncLLM, model: ServedModel, metrics: ServerMetrics, max_waiting_requests: int | None
    ) -> None:
        self.engine = engine
        self.model = model
        self.metrics = metrics
        self.max_waiting_requests = max_waiting_requests
        #: Engine requests admitted and still waiting for their first output.
        self.num_waiting = 0

    def check_model(self, name: str | None) -> None:
        """Refuse a request for a model this server does not serve."""
        if name is not None and name != self.model.name:
            raise OpenAIError(
                f"the model {name!r} does not exist; this server serves {self.model.name!r}",
                param="model", code="model_not_found",
            )

    def check_token_ids(self, token_ids: Sequence[int], param: str) -> None:
        """Refuse token ids outside the vocabulary."""
        bad = [t for t in token_ids if not 0 <= t < self.model.vocab_size]
        if bad:
            raise OpenAIError(f"token id {bad[0]} is outside the vocabulary [0, {self.model.vocab_size})", param=param)

    def max_tokens(self, num_prompt_tokens: int, requested: int | None, param: str) -> int:
        """The generation budget: `requested`, or all the room the context has left;
        refuse a prompt or budget that does not fit in max-model-len."""
        room = self.model.max_model_len - num_prompt_tokens
        if room < 1:
            raise OpenAIError(
                f"the prompt is {num_prompt_tokens} tokens, but this model's context is {self.model.max_model_len} "
                "tokens and needs room for at least one generated token",
                param="messages" if param == "max_completion_tokens" else "prompt", code="context_length_exceeded",
            )
        if requested is None:
            return room
        if requested > room:
            raise OpenAIError(
                f"{param}={requested} is too large: the prompt has {num_prompt_tokens} tokens and the context is "
                f"{self.model.max_model_len} tokens, so at most {room} can be generated",
                param=param, code="context_length_exceeded",
            )
        return requested

    def encode(self, text: str) -> list[int]:
        """A completion prompt's token ids (with the tokenizer's special tokens, e.g. BOS)."""
        return list(self.engine.tokenizer.encode(text))

    def decode_token(self, token_id: int) -> str:
        """One token's text, special tokens included."""
        return self.engine.tokenizer.decode([token_id], skip_special_tokens=False)

    def render_chat(self, messages: Sequence[ChatMessage], add_generation_prompt: bool) -> list[int]:
        """A conversation's prompt token ids, rendered by the model's chat template."""
        conversation = [{"role": m.role, "content": m.text()} for m in messages]
        tokenizer = self.engine.tokenizer
        try:
            token_ids = tokenizer.apply_chat_template(conversation, add_generation_prompt=add_generation_prompt, tokenize=True)
        except (ValueError, TemplateError) as error:  # no chat template, or the template refused the messages
            raise OpenAIError(str(error), param="messages") from error
        return list(token_ids)

    def sampling_params(self, request: SamplingFields, max_tokens: int, logprobs: int | None) -> SamplingParams:
        """The engine's SamplingParams for a request; invalid combinations become 400."""
        try:
            return SamplingParams(
                n=request.n,
                presence_penalty=request.presence_penalty,
                frequency_penalty=request.frequency_penalty,
                repetition_penalty=request.repetition_penalty,
                temperature=request.temperature,
                top_p=request.top_p,
                top_k=request.top_k,
                min_p=request.min_p,
                seed=request.seed,
                stop=request.stop,
                stop_token_ids=request.stop_token_ids,
                ignore_eos=request.ignore_eos,
                max_tokens=max_tokens,
                min_tokens=request.min_tokens,
                logprobs=logprobs,
            )
        except ValueError as error:
            raise OpenAIError(str(error)) from error

    async def start(
        self, prompts: Sequence[list[int]], params: SamplingParams, request_id: str, priority: int = 0
    ) -> list[RequestStream]:
        """Submit one engine request per prompt and wait for each one's first output.
        Refuses with 429 while too many requests wait for their first token."""
        if self.max_waiting_requests is not None and self.num_waiting + len(prompts) > self.max_waiting_requests:
            raise OpenAIError(
                f"the server is busy: {self.num_waiting} requests are waiting (limit {self.max_waiting_requests}); "
                "retry later", status_code=429, code="too_many_waiting_requests",
            )
        ids = [request_id if len(prompts) == 1 else f"{request_id}-{i}" for i in range(len(prompts))]
        generators = [
            self.engine.generate({"prompt_token_ids": prompt}, params, rid, priority=priority)
            for prompt, rid in zip(prompts, ids)
        ]
        self.num_waiting += len(prompts)
        try:
            firsts = await asyncio.gather(*(anext(g) for g in generators), return_exceptions=True)
        finally:
            self.num_waiting -= len(prompts)
        streams = [
            RequestStream(self.engine, self.metrics, rid, generator, first)
            for rid, generator, first in zip(ids, generators, firsts)
            if not isinstance(first, BaseException)
        ]
        failure = next((first for first in firsts if isinstance(first, BaseException)), None)
        if failure is not None:
            await abort_all(streams)
            if isinstance(failure, ValueError):  # the engine refused the prompt or settings
                raise OpenAIError(str(failure)) from failure
            raise engine_failure(failure) from failure
        return streams


def usage_of(outputs: Sequence[RequestOutput]) -> Usage:
    """Token counts of a response made of these (finished or partial) outputs."""
    prompt_tokens = sum(len(output.prompt_token_ids) for output in outputs)
    completion_tokens = sum(len(sample.token_ids) for output in outputs for sample in output.outputs)
    total_tokens = prompt_tokens + completion_tokens
    return Usage(prompt_tokens=prompt_tokens, completion_tokens=completion_tokens, total_tokens=total_tokens)
