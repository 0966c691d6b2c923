"""The tool-parser interface and its registry."""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, ClassVar

from ..parser_registry import ParserRegistry
from ...core.structured_output.schemas import embed_schemas

@dataclass(frozen=True)
class ParsedToolCall:
    """One call found in the output: the function's name and its arguments as JSON text."""

    name: str
    arguments: str


@dataclass(frozen=True)
class ExtractedToolCalls:
    """A finished output split into the text around the calls and the calls."""

    content: str | None
    calls: list[ParsedToolCall]


@dataclass(frozen=True)
class ToolCallDelta:
    """A piece of a streamed call, as OpenAI's `delta.tool_calls[i]` carries it: the
    call's `index` among the message's calls, its `name` on the call's first piece only,
    and the next text of its JSON `arguments`."""

    index: int
    name: str | None = None
    arguments: str = ""


@dataclass(frozen=True)
class StreamingToolCalls:
    """What a piece of streamed output adds: plain text, and pieces of calls."""

    content: str
    calls: list[ToolCallDelta]


class ToolParser(ABC):
    """Reads one model family's tool-call format; a fresh instance per choice (the
    streaming state is the instance's). Every parser gets the request's `tools` (OpenAI
    function definitions: name, parameters), which formats that write arguments as text
    read their types from, and the model tokenizer's `added_tokens` (text to id), which
    formats that differ by tokenizer version tell the version by."""

    #: Whether the format's markers are special tokens, which the output must then keep
    #: (the server decodes it with skip_special_tokens off while it parses calls).
    KEEPS_SPECIAL_TOKENS: ClassVar[bool] = False

    def __init__(self, tools: Sequence[dict[str, Any]] = (), added_tokens: Mapping[str, int] | None = None) -> None:
        self.tools = list(tools)
        self.added_tokens = dict(added_tokens or {})
        self._calls_begun = 0

    @classmethod
    def check_tokenizer(cls, added_tokens: Mapping[str, int]) -> None:
        """Raise ValueError, at server start, when the model's tokenizer lacks a token
        this format needs."""

    def parameters(self, name: str) -> dict[str, Any] | None:
        """The parameter schema of the tool called `name`, if the request has one."""
        for tool in self.tools:
            if tool.get("name") == name:
                return tool.get("parameters") or {"type": "object"}
        return None

    def begin_call(self, name: str, arguments: str = "") -> ToolCallDelta:
        """The first piece of the next call: its name (and the start of its arguments)."""
        self._calls_begun += 1
        return ToolCallDelta(self._calls_begun - 1, name, arguments)

    def continue_call(self, arguments: str) -> ToolCallDelta:
        """More arguments text of the call begun last."""
        return ToolCallDelta(self._calls_begun - 1, None, arguments)

    def whole_calls(self, calls: Sequence[ParsedToolCall]) -> list[ToolCallDelta]:
        """Complete calls as one piece each (formats that know a call only once it ends)."""
        return [self.begin_call(call.name, call.arguments) for call in calls]

    @abstractmethod
    def extract(self, text: str) -> ExtractedToolCalls:
        """The calls in a whole output."""

    @abstractmethod
    def feed(self, delta: str) -> StreamingToolCalls:
        """Take the next piece of streamed output; text that may still turn out to be
        part of a call is held back until it is known."""

    @abstractmethod
    def finish(self) -> StreamingToolCalls:
        """The end of the stream: whatever was held back (calls a format only knows
        complete at the end, and an unfinished call as text)."""

    @abstractmethod
    def grammar(self, parallel: bool) -> str:
        """A Lark grammar (llguidance's dialect) whose every output is one call (more
        when `parallel`) in this format, to one of the tools, with arguments matching
        its schema."""


def tool_call_schema(tools: Sequence[dict[str, Any]], arguments_key: str) -> dict[str, Any]:
    """The JSON schema of one call object `{"name": ..., <arguments_key>: {...}}` to
    one of `tools`, compact (no free whitespace). Each tool's parameter schema keeps
    its `$defs`/`$ref`s working: they are hoisted to this schema's root."""
    parameters = {tool["name"]: tool.get("parameters") or {"type": "object"} for tool in tools}
    placed, definitions = embed_schemas(parameters)
    variants = [
        {
            "type": "object",
            "properties": {"name": {"const": name}, arguments_key: placed[name]},
            "required": ["name", arguments_key],
            "additionalProperties": False,
        }
        for name in parameters
    ]
    return {"anyOf": variants, "$defs": definitions, "x-guidance": {"whitespace_flexible": False}}


_REGISTRY: ParserRegistry[type[ToolParser]] = ParserRegistry("tool call parser")
#: Class decorator adding a parser to the registry under a name.
register = _REGISTRY.register
#: The registered parsers' names, sorted.
tool_parser_names = _REGISTRY.names
#: The parser registered under a name; ValueError listing the known ones otherwise.
get_tool_parser = _REGISTRY.get
