"""The tool-parser interface and its registry."""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

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
class StreamingToolCalls:
    """What a piece of streamed output adds: plain text, and calls now complete."""

    content: str
    calls: list[ParsedToolCall]


class ToolParser(ABC):
    """Reads one model family's tool-call format; a fresh instance per choice (the
    streaming state is the instance's)."""

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

    @classmethod
    @abstractmethod
    def grammar(cls, tools: Sequence[dict[str, Any]], parallel: bool) -> str:
        """A Lark grammar (llguidance's dialect) whose every output is one call (more
        when `parallel`) in this format, to one of `tools` (OpenAI function
        definitions: name, parameters) with arguments matching its schema."""


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
