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
from .drain import DrainDeadline
from .errors import OpenAIError
from .logprobs import LogprobFormat
from .metrics import ServerMetrics
from .options import ServerOptions
from .prompt_tokenizer import PromptTokenizer, yield_the_cpu_to_serving
from .protocol import ChatMessage, SamplingFields, Tool, Usage
from .request_stream import RequestStream, abort_all, engine_failure


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

    async def off_loop(self, function: Callable[..., T], *args: Any, **kwargs: Any) -> T:
        """Run a CPU-heavy call (tokenising, template rendering) in the tokenizer pool."""
        loop = asyncio.get_running_loop()
        return await loop.run_in_executor(self._cpu_pool, functools.partial(function, *args, **kwargs))

    def close(self) -> None:
        """Stop the tokenizer pool and process."""
        self._cpu_pool.shutdown(wait=False, cancel_futures=True)
        self._prompts.close()

    def check_model(self, name: str | None) -> None:
        """Refuse, with 404 as OpenAI and vLLM, a request for a model this server does not serve."""
        if name is not None and name != self.model.name and name not in self.model.aliases:
            raise OpenAIError(
                f"the model {name!r} does not exist; this server serves {self.model.name!r}",
                status_code=404, param="model", code="model_not_found",
            )

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
        before making them a list."""
        with self.metrics.tokenizing():
            return await self._prompts.encode(text, add_special_tokens)

    def decode(self, token_ids: Sequence[int]) -> str:
        """The text of some token ids (special tokens left out)."""
        return self.engine.tokenizer.decode(list(token_ids))

    def logprob_format(self, as_token_ids: bool) -> LogprobFormat:
        """How this request's logprobs name tokens (text, or `token_id:N`)."""
        return LogprobFormat(self._decode_token, self._token_bytes, self._is_special, as_token_ids)

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
            added = self.engine.tokenizer.tokenizer.get_added_tokens_decoder()
            self._special_ids = frozenset(t for t, token in added.items() if token.special)
        return token_id in self._special_ids

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
        self, messages: Sequence[ChatMessage], add_generation_prompt: bool, tools: Sequence[Tool] | None = None
    ) -> Sequence[int]:
        """A conversation's prompt token ids (as `tokenize` gives them), rendered by the
        model's chat template off the event loop (tool calls, tool results and tool
        definitions passed to the template as Hugging Face templates expect them)."""
        conversation = [message_for_template(m) for m in messages]
        options: dict[str, Any] = {}
        if tools:
            options["tools"] = [tool.model_dump(exclude_none=True) for tool in tools]
        tokenizer = self.engine.tokenizer
        try:
            text = await self.off_loop(
                tokenizer.apply_chat_template, conversation, add_generation_prompt=add_generation_prompt, **options
            )
        except (ValueError, TemplateError) as error:  # no chat template, or the template refused the messages
            raise OpenAIError(str(error), param="messages") from error
        return await self.tokenize(text, add_special_tokens=False)  # the template writes the special tokens

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
                **extra,
            )
            params.verify_vocab(self.model.vocab_size)
        except ValueError as error:
            raise OpenAIError(str(error), param=_param_named_in(str(error))) from error
        return params

    async def start(
        self, prompts: Sequence[list[int]], params: SamplingParams, request_id: str, priority: int = 0
    ) -> list[RequestStream]:
        """Submit one engine request per prompt and wait for each one's first output.
        Refuses with 429 while too many requests wait for their first token."""
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
        generators = [
            self.engine.generate({"prompt_token_ids": prompt}, params, rid, priority=priority)
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


def message_for_template(message: ChatMessage) -> dict[str, Any]:
    """A chat message as Hugging Face chat templates read it: role and text content,
    plus an assistant's tool calls (arguments as objects) and a tool result's call id."""
    entry: dict[str, Any] = {"role": message.role, "content": message.text()}
    if message.name is not None:
        entry["name"] = message.name
    if message.tool_calls:
        entry["tool_calls"] = [
            {"id": call.id, "type": "function",
             "function": {"name": call.function.name, "arguments": _arguments_object(call.function.arguments)}}
            for call in message.tool_calls
        ]
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


def refuse_unsupported(request: BaseModel, names: Sequence[str]) -> None:
    """Refuse, with a 400 naming it, the first of `names` the request sets: a field
    silently ignored would give the client something it did not ask for."""
    for name in names:
        if getattr(request, name, None) is not None:
            raise OpenAIError(f"{name} is not supported by this server", param=name, code="unsupported_parameter")


def usage_of(outputs: Sequence[RequestOutput], count_completion: bool = True) -> Usage:
    """Token counts of a response made of these (finished or partial) outputs
    (`count_completion` False when the generated tokens are not part of it: echo with
    max_tokens=0)."""
    prompt_tokens = sum(len(output.prompt_token_ids) for output in outputs)
    completion_tokens = sum(len(sample.token_ids) for output in outputs for sample in output.outputs)
    completion_tokens *= count_completion
    total_tokens = prompt_tokens + completion_tokens
    return Usage(prompt_tokens=prompt_tokens, completion_tokens=completion_tokens, total_tokens=total_tokens)
