"""What completions and chat share: the served model's identity, prompt and parameter
checks, admission control, and starting engine requests.

A request is started before the HTTP response begins: the handler waits for each
engine request's first output, so a refusal (429) or an engine failure before the first
token still gets a proper status code rather than an error inside a 200 stream.
"""

from __future__ import annotations

import asyncio
import functools
import json
import re
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any, TypeVar

from jinja2.exceptions import TemplateError
from pydantic import BaseModel

from ..core.engine.client import EngineClient
from ..core.config import SchedulingPolicy
from ..core.outputs import RequestOutput
from ..core.sampling_params import SamplingParams
from ..core.structured_output import StructuredOutputsParams, token_bytes_function
from ..core.cache_affinity import CacheAffinity
from ..core.thinking import ThinkingMarkers, count_reasoning_tokens
from .drain import DrainDeadline
from .errors import OpenAIError
from .logprobs import LogprobFormat
from .metrics import ServerMetrics
from .options import ServerOptions
from .prompt_tokenizer import PromptTokenizer, TokenizerProcessError, yield_the_cpu_to_serving
from .protocol import (
    ChatMessage,
    CompletionTokensDetails,
    PromptLogprob,
    PromptLogprobs,
    PromptTokensDetails,
    SamplingFields,
    Tool,
    Usage,
)
from .lora_adapters import ServedAdapters
from .request_stream import RequestStream, abort_all, engine_failure
from ..core.lora.request import LoRARequest


@dataclass(frozen=True)
class ServedModel:
    """The model as the API presents it."""

    name: str
    root: str
    max_model_len: int
    vocab_size: int
    description: str | None = None
    #: Further names the API accepts for the model (vLLM's extra --served-model-name values).
    aliases: tuple[str, ...] = ()
    #: The engine's order of waiting requests; `priority` is refused under fcfs (as vLLM).
    scheduling_policy: SchedulingPolicy = "fcfs"


T = TypeVar("T")

#: Seconds a client told 429 should wait before retrying.
RETRY_AFTER_S = 1


class OpenAIServing:
    """Shared serving logic over one EngineClient."""

    def __init__(
        self,
        engine: EngineClient,
        model: ServedModel,
        metrics: ServerMetrics,
        options: ServerOptions,
        drain: DrainDeadline | None = None,
    ) -> None:
        self.engine = engine
        self.drain = drain
        self.model = model
        self.metrics = metrics
        self.options = options
        self.max_waiting_requests = options.max_waiting_requests
        #: Engine requests admitted and still waiting for their first output.
        self.num_waiting = 0
        # Tokenising a long prompt or rendering a template takes long enough to stall
        # every stream if done on the event loop; Tokenizer.tokenize releases the GIL.
        self._token_bytes_function: Callable[[int], bytes] | None = None
        self._special_ids: frozenset[int] | None = None
        self._cpu_pool = ThreadPoolExecutor(
            max_workers=2, thread_name_prefix="accord-tokenize", initializer=yield_the_cpu_to_serving
        )
        self._prompts = PromptTokenizer(engine.tokenizer, self._cpu_pool)
        #: The LoRA adapters served by name (--lora-modules, then the load endpoint).
        self.adapters = ServedAdapters(engine, (model.name, *model.aliases))
        for module in options.lora_modules:
            try:
                self.adapters.add(module)
            except OpenAIError as error:  # at start-up: `accord serve` reports it and exits
                raise ValueError(f"--lora-modules {module.name}: {error.message}") from error

    async def off_loop(self, function: Callable[..., T], *args: Any, **kwargs: Any) -> T:
        """Run a CPU-heavy call (tokenising, template rendering) in the tokenizer pool."""
        loop = asyncio.get_running_loop()
        return await loop.run_in_executor(self._cpu_pool, functools.partial(function, *args, **kwargs))

    def close(self) -> None:
        """Stop the tokenizer pool and process."""
        self._cpu_pool.shutdown(wait=False, cancel_futures=True)
        self._prompts.close()

    def check_model(self, name: str | None) -> LoRARequest | None:
        """The LoRA adapter a request's `model` names (None: the base model); 404, as
        OpenAI and vLLM, for a model this server does not serve."""
        if name is None or name == self.model.name or name in self.model.aliases:
            return None
        adapter = self.adapters.get(name)
        if adapter is None:
            served = ", ".join(repr(n) for n in (self.model.name, *(a.lora_name for a in self.adapters)))
            raise OpenAIError(
                f"The model `{name}` does not exist. This server serves {served}",
                status_code=404, param="model", code="model_not_found",
            )
        return adapter

    def check_token_ids(self, token_ids: Sequence[int], param: str) -> None:
        """Refuse token ids outside the vocabulary."""
        bad = [t for t in token_ids if not 0 <= t < self.model.vocab_size]
        if bad:
            raise OpenAIError(f"token id {bad[0]} is outside the vocabulary [0, {self.model.vocab_size})", param=param)

    def check_priority(self, request: SamplingFields) -> None:
        """Refuse `priority` unless the engine orders waiting requests by it (as vLLM)."""
        if request.priority != 0 and self.model.scheduling_policy != "priority":
            raise OpenAIError(
                f"priority is only honoured with --scheduling-policy priority; this server uses "
                f"{self.model.scheduling_policy!r}", param="priority",
            )

    def check_prompt_fits(self, num_prompt_tokens: int, param: str) -> None:
        """Refuse a prompt that leaves no room in max-model-len for a generated token."""
        if num_prompt_tokens >= self.model.max_model_len:
            raise OpenAIError(
                f"the prompt is {num_prompt_tokens} tokens, but this model's context is {self.model.max_model_len} "
                "tokens and needs room for at least one generated token",
                param=param, code="context_length_exceeded",
            )

    def max_tokens(self, num_prompt_tokens: int, requested: int | None, param: str) -> int:
        """The generation budget: `requested`, or all the room the context has left;
        refuse a prompt or budget that does not fit in max-model-len."""
        self.check_prompt_fits(num_prompt_tokens, "messages" if param == "max_completion_tokens" else "prompt")
        room = self.model.max_model_len - num_prompt_tokens
        if requested is None:
            return room
        if requested > room:
            raise OpenAIError(
                f"{param}={requested} is too large: the prompt has {num_prompt_tokens} tokens and the context is "
                f"{self.model.max_model_len} tokens, so at most {room} can be generated",
                param=param, code="context_length_exceeded",
            )
        return requested

    async def tokenize(self, text: str, add_special_tokens: bool = True) -> Sequence[int]:
        """A prompt's token ids (by default with the tokenizer's special tokens, e.g.
        BOS), made where they stall nothing (see PromptTokenizer), and counted in the
        tokenizing gauge meanwhile. A long prompt's come packed: check the length
        before making them a list. 503 when the tokenizer process fails on the prompt."""
        with self.metrics.tokenizing():
            try:
                return await self._prompts.encode(text, add_special_tokens)
            except TokenizerProcessError as error:
                raise OpenAIError(f"{error} on a prompt of {len(text)} characters; the next one starts another",
                                  status_code=503, code="tokenizer_unavailable") from None

    def decode(self, token_ids: Sequence[int], skip_special_tokens: bool = True) -> str:
        """The text of some token ids (special tokens left out unless told otherwise)."""
        return self.engine.tokenizer.decode(list(token_ids), skip_special_tokens=skip_special_tokens)

    def token_text(self, token_id: int) -> str:
        """One token's own text (special tokens included)."""
        return self._decode_token(token_id)

    def logprob_format(self, as_token_ids: bool | None) -> LogprobFormat:
        """How this request's logprobs name tokens (text, or `token_id:N`; None: as
        --return-tokens-as-token-ids says)."""
        if as_token_ids is None:
            as_token_ids = self.options.return_tokens_as_token_ids
        return LogprobFormat(self._decode_token, self._token_bytes, self._is_special, as_token_ids)

    def num_logprobs(self, requested: int | None, param: str) -> int | None:
        """The engine's logprob count for a request's `requested` (-1: the whole
        vocabulary); refused past --max-logprobs (-1 there: no limit), as vLLM."""
        if requested is None:
            return None
        count = self.model.vocab_size if requested == -1 else requested
        limit = self.options.max_logprobs
        if limit != -1 and count > limit:
            raise OpenAIError(
                f"{param}={requested} asks for {count} logprobs, more than this server allows ({limit}); it was "
                "started with --max-logprobs (-1 for the whole vocabulary)", param=param,
            )
        return count

    def truncate(self, token_ids: Sequence[int], request: SamplingFields) -> Sequence[int]:
        """A prompt cut to `truncate_prompt_tokens` (-1: the context length) from the
        `truncation_side` (left by default: the prompt's end stays), as vLLM."""
        keep = request.truncate_prompt_tokens
        if request.truncation_side is not None and keep is None:
            raise OpenAIError("truncation_side needs truncate_prompt_tokens", param="truncation_side")
        if keep is None:
            return token_ids
        if keep == -1:
            keep = self.model.max_model_len
        if keep > self.model.max_model_len:
            raise OpenAIError(
                f"truncate_prompt_tokens={keep} is more than the context length ({self.model.max_model_len})",
                param="truncate_prompt_tokens",
            )
        if len(token_ids) <= keep:
            return token_ids
        return token_ids[:keep] if request.truncation_side == "right" else token_ids[len(token_ids) - keep:]

    def _decode_token(self, token_id: int) -> str:
        return self.engine.tokenizer.decode([token_id], skip_special_tokens=False)

    def _token_bytes(self, token_id: int) -> bytes:
        # llguidance knows every token's raw bytes (byte-level BPE and byte fallback
        # alike); built on first use, so servers never asked for logprobs never pay.
        if self._token_bytes_function is None:
            self._token_bytes_function = token_bytes_function(self.engine.tokenizer)
        return self._token_bytes_function(token_id)

    def _is_special(self, token_id: int) -> bool:
        if self._special_ids is None:
            self._special_ids = frozenset(self.engine.tokenizer.added_tokens(special_only=True).values())
        return token_id in self._special_ids

    def stream_usage(
        self,
        request: SamplingFields,
        outputs: Callable[[], Sequence[RequestOutput]],
        count_completion: bool = True,
        thinking_markers: ThinkingMarkers | None = None,
        details: bool | None = None,
    ) -> StreamUsage:
        """Where a stream reports usage: on a last chunk with `include_usage`, and on
        every chunk too with vLLM's `continuous_usage_stats` (both, whatever the request
        asks, under --enable-force-include-usage, as vLLM's `should_include_usage`);
        with a reasoning model's `thinking_markers`, the thinking tokens among the
        completion tokens; the cached prompt tokens when `details` (None: as
        --enable-prompt-tokens-details says)."""
        stream_options = request.stream_options
        forced = self.options.enable_force_include_usage
        at_end = forced or bool(stream_options and stream_options.include_usage)
        continuous = forced or (at_end and bool(stream_options and stream_options.continuous_usage_stats))
        if details is None:
            details = self.options.enable_prompt_tokens_details
        return StreamUsage(outputs, count_completion, details, at_end, continuous, thinking_markers)

    @staticmethod
    def check_stream_options(request: SamplingFields) -> None:
        """Refuse `stream_options` on a request that does not stream (OpenAI does)."""
        if request.stream_options is not None and not request.stream:
            raise OpenAIError("stream_options is only allowed with stream=true", param="stream_options")

    @staticmethod
    def structured_outputs(request: SamplingFields) -> StructuredOutputsParams | None:
        """The output constraint a request asks for, from whichever one of
        `response_format`, vLLM's `guided_*` fields and `structured_outputs` it uses."""
        given: list[tuple[str, dict[str, Any]]] = []
        response_format = request.response_format
        if response_format is not None and response_format.type == "json_object":
            given.append(("response_format", {"json_object": True}))
        elif response_format is not None and response_format.type == "json_schema":
            if response_format.json_schema is None:
                raise OpenAIError("response_format json_schema needs a json_schema", param="response_format")
            given.append(("response_format", {"json": response_format.json_schema.schema_}))
        guided = {
            "json": request.guided_json, "regex": request.guided_regex,
            "choice": request.guided_choice, "grammar": request.guided_grammar,
        }
        given += [(f"guided_{name}", {name: value}) for name, value in guided.items() if value is not None]
        if request.structured_outputs is not None:
            given.append(("structured_outputs", request.structured_outputs.model_dump(exclude_none=True, by_alias=True)))
        if not given:
            return None
        if len(given) > 1:
            raise OpenAIError(
                f"send one output constraint, not {' and '.join(name for name, _ in given)}", param=given[1][0]
            )
        param, fields = given[0]
        try:
            return StructuredOutputsParams(**fields)
        except ValueError as error:
            raise OpenAIError(str(error), param=param) from None

    async def render_chat(
        self,
        messages: Sequence[ChatMessage],
        add_generation_prompt: bool,
        tools: Sequence[Tool] | None = None,
        *,
        continue_final_message: bool = False,
        add_special_tokens: bool = False,
        chat_template: str | None = None,
        template_kwargs: dict[str, Any] | None = None,
    ) -> Sequence[int]:
        """A conversation's prompt token ids (as `tokenize` gives them), rendered by the
        chat template off the event loop: tool calls, tool results and tool definitions
        as Hugging Face templates expect them, content as --chat-template-content-format
        says, and the template variables of --default-chat-template-kwargs and the
        request. With `continue_final_message` the prompt ends inside the last message."""
        if continue_final_message and add_generation_prompt:
            raise OpenAIError("continue_final_message and add_generation_prompt cannot both be true",
                              param="continue_final_message")
        options = self.options
        if chat_template is not None and not options.trust_request_chat_template:
            raise OpenAIError("this server uses its own chat template: a request's chat_template is honoured only "
                              "with --trust-request-chat-template", param="chat_template")
        template = chat_template or options.chat_template
        as_parts = self._content_as_parts(template)
        conversation = [message_for_template(m, as_parts) for m in messages]
        variables: dict[str, Any] = {**options.default_chat_template_kwargs, **(template_kwargs or {})}
        if tools:
            variables["tools"] = [tool.model_dump(exclude_none=True) for tool in tools]
        tokenizer = self.engine.tokenizer
        try:
            text = await self.off_loop(
                tokenizer.apply_chat_template, conversation, add_generation_prompt=add_generation_prompt,
                chat_template=template, **variables,
            )
        except (ValueError, TemplateError, TypeError) as error:  # no template, or the template refused the messages
            raise OpenAIError(str(error), param="messages") from error
        if continue_final_message:
            text = _open_final_message(text, messages[-1].text())
        # The template writes the special tokens; add_special_tokens adds the tokenizer's too.
        return await self.tokenize(text, add_special_tokens=add_special_tokens)

    def _content_as_parts(self, template: str | None) -> bool:
        """Whether message content reaches the template as OpenAI's list of parts."""
        content_format = self.options.chat_template_content_format
        if content_format != "auto":
            return content_format == "openai"
        source = template if template is not None else self.engine.tokenizer.chat_template
        return bool(source and _LOOPS_OVER_CONTENT.search(source))

    @staticmethod
    def affinity(request: SamplingFields) -> CacheAffinity:
        """The request's hints for the engine: its cache_salt, agent session and tenant."""
        return CacheAffinity(request.cache_salt, request.session_id, request._tenant)

    def sampling_params(
        self, request: SamplingFields, max_tokens: int, logprobs: int | None, **extra: Any
    ) -> SamplingParams:
        """The engine's SamplingParams for a request; invalid combinations become 400."""
        self.check_priority(request)
        try:
            logit_bias = {int(token): bias for token, bias in (request.logit_bias or {}).items()}
        except ValueError:
            raise OpenAIError("logit_bias keys must be token ids (integers as strings)", param="logit_bias") from None
        try:
            params = SamplingParams(
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
                logit_bias=logit_bias or None,
                include_stop_str_in_output=request.include_stop_str_in_output,
                skip_special_tokens=request.skip_special_tokens,
                extra_args={"kv_transfer_params": request.kv_transfer_params} if request.kv_transfer_params else None,
                **extra,
            )
            params.verify_vocab(self.model.vocab_size)
        except ValueError as error:
            raise OpenAIError(str(error), param=_param_named_in(str(error))) from error
        return params

    async def start(
        self, prompts: Sequence[list[int]], params: SamplingParams, request_id: str, priority: int = 0,
        lora_request: LoRARequest | None = None, affinity: CacheAffinity = CacheAffinity(),
    ) -> list[RequestStream]:
        """Submit one engine request per prompt (under `lora_request`'s adapter, if
        given; with `affinity`'s cache salt, agent session and tenant) and wait for each one's
        first output. Refuses with 429 while too many
        requests wait for their first token."""
        limit = self.max_waiting_requests
        if limit is not None and len(prompts) > limit:
            # Retrying would never help: say so with a 400, not a 429.
            raise OpenAIError(
                f"the request has {len(prompts)} prompts, more than this server ever admits at once ({limit}); "
                "split it", param="prompt", code="too_many_prompts",
            )
        if limit is not None and self.num_waiting + len(prompts) > limit:
            self.metrics.request_rejected("too_many_waiting_requests")
            raise OpenAIError(
                f"the server is busy: {self.num_waiting} requests are waiting (limit {limit}); retry later",
                status_code=429, code="too_many_waiting_requests", headers={"Retry-After": str(RETRY_AFTER_S)},
            )
        ids = [request_id if len(prompts) == 1 else f"{request_id}-{i}" for i in range(len(prompts))]
        # The adapter is passed only when there is one: an engine without LoRA need not take it.
        lora = {"lora_request": lora_request} if lora_request is not None else {}
        generators = [
            self.engine.generate({"prompt_token_ids": prompt, **affinity.prompt_fields()}, params, rid,
                                 priority=priority, **lora)
            for prompt, rid in zip(prompts, ids)
        ]
        self.num_waiting += len(prompts)
        try:
            firsts = await asyncio.gather(*(anext(g) for g in generators), return_exceptions=True)
        except asyncio.CancelledError:  # the client went away while its requests waited
            await self._abort_waiting(ids)
            raise
        finally:
            self.num_waiting -= len(prompts)
        streams = [
            RequestStream(self.engine, self.metrics, rid, generator, first, self.drain)
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

    async def _abort_waiting(self, request_ids: Sequence[str]) -> None:
        """Abort engine requests that never reached a RequestStream, each counted as
        an abort (as the streams count theirs)."""
        for request_id in request_ids:
            await self.engine.abort(request_id)
            self.metrics.request_ended_early("abort")


#: A template that loops over a message's content reads it as a list of parts (vLLM's
#: "auto" content format detects the same).
_LOOPS_OVER_CONTENT = re.compile(r"for\s+\w+\s+in\s+\w+(\[\s*['\"]content['\"]\s*\]|\.content)")


def _open_final_message(rendered: str, final_text: str) -> str:
    """`rendered` cut right after the last message's text, so generation continues it."""
    final_text = final_text.strip()  # templates often trim the content they write
    end = rendered.rfind(final_text) if final_text else -1
    if end < 0:
        raise OpenAIError("continue_final_message needs a last message whose text the chat template writes out",
                          param="continue_final_message")
    return rendered[: end + len(final_text)]


def message_for_template(message: ChatMessage, as_parts: bool = False) -> dict[str, Any]:
    """A chat message as Hugging Face chat templates read it: role and content (its
    text, or OpenAI's list of text parts when `as_parts`), plus an assistant's tool
    calls (arguments as objects) and thinking (`reasoning_content`, and `reasoning` as
    vLLM also names it), and a tool result's call id."""
    content: Any = [{"type": "text", "text": message.text()}] if as_parts else message.text()
    if as_parts and isinstance(message.content, list):
        content = [part.model_dump() for part in message.content]
    entry: dict[str, Any] = {"role": message.role, "content": content}
    if message.name is not None:
        entry["name"] = message.name
    if message.tool_calls:
        entry["tool_calls"] = [
            {"id": call.id, "type": "function",
             "function": {"name": call.function.name, "arguments": _arguments_object(call.function.arguments)}}
            for call in message.tool_calls
        ]
    if message.reasoning_content is not None:
        entry["reasoning_content"] = entry["reasoning"] = message.reasoning_content
    if message.tool_call_id is not None:
        entry["tool_call_id"] = message.tool_call_id
    return entry


def _arguments_object(arguments: str) -> Any:
    # Templates (Hermes, Qwen, Llama) serialise arguments themselves, so they want the object.
    try:
        return json.loads(arguments)
    except json.JSONDecodeError:
        return arguments


def _param_named_in(message: str) -> str | None:
    # SamplingParams messages start with the field's name ("top_k must be ...").
    name = message.split(" ", 1)[0]
    return name if name.isidentifier() else None


#: vLLM's request fields accord does not implement (both endpoints).
UNSUPPORTED_VLLM_FIELDS = ("logprob_token_ids", "allowed_token_ids", "bad_words")


def refuse_unsupported(request: BaseModel, names: Sequence[str]) -> None:
    """Refuse, with a 400 naming it, the first of `names` (and of vLLM's fields accord
    lacks) the request sets to anything but null or empty: a field silently ignored
    would give the client something it did not ask for."""
    for name in (*names, *UNSUPPORTED_VLLM_FIELDS):
        if getattr(request, name, None) not in (None, [], {}):
            raise OpenAIError(f"{name} is not supported by this server", param=name, code="unsupported_parameter")
    if not getattr(request, "spaces_between_special_tokens", True):
        raise OpenAIError("spaces_between_special_tokens=false is not supported by this server",
                          param="spaces_between_special_tokens", code="unsupported_parameter")


@dataclass(frozen=True)
class StreamUsage:
    """A stream's usage reporting (see `OpenAIServing.stream_usage`): `outputs` gives
    the requests' latest outputs whenever a chunk is written."""

    outputs: Callable[[], Sequence[RequestOutput]]
    count_completion: bool
    details: bool
    #: Whether the stream ends with a usage-only chunk.
    at_end: bool
    #: Whether every chunk carries the usage so far.
    continuous: bool
    #: A reasoning model's markers: usage then counts the thinking tokens.
    thinking_markers: ThinkingMarkers | None = None

    def running(self) -> Usage | None:
        """The usage so far for a chunk, when every chunk carries it."""
        return self.final() if self.continuous else None

    def final(self) -> Usage:
        """The usage of everything streamed."""
        return usage_of(self.outputs(), self.count_completion, self.details, self.thinking_markers)


def usage_of(
    outputs: Sequence[RequestOutput],
    count_completion: bool = True,
    details: bool = False,
    thinking_markers: ThinkingMarkers | None = None,
) -> Usage:
    """Token counts of a response made of these (finished or partial) outputs
    (`count_completion` False when the generated tokens are not part of it: echo with
    max_tokens=0), with the prompt tokens found in the prefix cache when `details`, and
    the thinking tokens among the completion tokens given a reasoning model's markers."""
    prompt_tokens = sum(len(output.prompt_token_ids) for output in outputs)
    completion_tokens = sum(len(sample.token_ids) for output in outputs for sample in output.outputs)
    completion_tokens *= count_completion
    total_tokens = prompt_tokens + completion_tokens
    cached = PromptTokensDetails(cached_tokens=sum(output.num_cached_tokens for output in outputs)) if details else None
    reasoning = None
    if thinking_markers is not None:
        reasoning = CompletionTokensDetails(reasoning_tokens=sum(
            count_reasoning_tokens(thinking_markers, output.prompt_token_ids, sample.token_ids)
            for output in outputs for sample in output.outputs
        ))
    return Usage(
        prompt_tokens=prompt_tokens, completion_tokens=completion_tokens, total_tokens=total_tokens,
        prompt_tokens_details=cached, completion_tokens_details=reasoning,
    )


def prompt_logprobs_of(output: RequestOutput, fmt: LogprobFormat) -> PromptLogprobs | None:
    """An output's prompt logprobs in vLLM's response shape (candidates by token id)."""
    if output.prompt_logprobs is None:
        return None
    return [
        None if candidates is None else {
            token_id: PromptLogprob(logprob=entry.logprob, rank=entry.rank, decoded_token=fmt.name(token_id, entry))
            for token_id, entry in candidates.items()
        }
        for candidates in output.prompt_logprobs
    ]
