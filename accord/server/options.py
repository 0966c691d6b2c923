"""The server's own settings (vLLM's frontend flags of the same names), as one typed
value the command line builds and the app reads."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Literal

from .body_limit import DEFAULT_MAX_REQUEST_BODY_BYTES
from .lora_modules import LoRAModulePath

#: The thinking budget of each `reasoning_effort` unless --reasoning-budgets says otherwise.
DEFAULT_REASONING_BUDGETS: Mapping[str, int] = {"low": 256, "medium": 1024, "high": 4096}

#: Stored responses the Responses API keeps unless --responses-store-size says otherwise.
DEFAULT_RESPONSES_STORE_SIZE = 1024

#: vLLM's default --max-logprobs (OpenAI's cap on top_logprobs is 20 too).
DEFAULT_MAX_LOGPROBS = 20

#: How message content reaches the chat template: "string" (the parts' text joined),
#: "openai" (the list of parts), or "auto" (chosen from the template's source).
ContentFormat = Literal["auto", "string", "openai"]


@dataclass(frozen=True)
class ServerOptions:
    """What `accord serve` sets besides the engine: authentication, admission, tool
    calling, logprobs, chat templates and usage reporting."""

    #: Keys any of which a client must send as `Authorization: Bearer <key>`.
    api_keys: tuple[str, ...] = ()
    max_waiting_requests: int | None = None
    max_request_body_bytes: int = DEFAULT_MAX_REQUEST_BODY_BYTES
    tool_call_parser: str = "hermes"
    #: The reasoning parser that splits thinking from answer (None: the output is all answer).
    reasoning_parser: str | None = None
    #: The thinking budget of each `reasoning_effort` (with a reasoning parser).
    reasoning_budgets: Mapping[str, int] = field(default_factory=lambda: dict(DEFAULT_REASONING_BUDGETS))
    #: Whether `tool_choice: "auto"` is served (vLLM needs --enable-auto-tool-choice;
    #: accord serves it unless --disable-auto-tool-choice).
    enable_auto_tool_choice: bool = True
    exclude_tools_when_tool_choice_none: bool = False
    #: The most logprobs a request may ask for; -1 for the whole vocabulary.
    max_logprobs: int = DEFAULT_MAX_LOGPROBS
    #: The path prefix of a path-routing proxy (ASGI's root_path, as vLLM sets it).
    root_path: str = ""
    #: The default of the request field of the same name.
    return_tokens_as_token_ids: bool = False
    #: A Jinja chat template replacing the model's (the template itself, not a path).
    chat_template: str | None = None
    chat_template_content_format: ContentFormat = "auto"
    #: Whether a request's own `chat_template` is used (refused otherwise, as vLLM).
    trust_request_chat_template: bool = False
    default_chat_template_kwargs: dict[str, Any] = field(default_factory=dict)
    #: Whether usage carries prompt_tokens_details (cached prompt tokens).
    enable_prompt_tokens_details: bool = False
    #: Whether every stream ends with usage, asked for or not.
    enable_force_include_usage: bool = False
    disable_fastapi_docs: bool = False
    #: LoRA adapters served from the start (--lora-modules; the engine needs --enable-lora).
    lora_modules: tuple[LoRAModulePath, ...] = ()
    #: Whether /v1/load_lora_adapter and /v1/unload_lora_adapter are served.
    allow_runtime_lora_updating: bool = False
    #: How many stored responses (`store: true`) the Responses API keeps, least recently used out.
    responses_store_size: int = DEFAULT_RESPONSES_STORE_SIZE
