"""Tool-call parsers by name: each reads tool calls out of a model family's output
(whole or streamed) and writes the grammar that forces calls in that format, so
`tool_choice` "required" and named choices are enforced by structured generation.

Add a parser by subclassing ToolParser and decorating it with `@register("name")`.
"""

from __future__ import annotations

from .base import ExtractedToolCalls, ParsedToolCall, StreamingToolCalls, ToolCallDelta, ToolParser, get_tool_parser, register, tool_parser_names
from .deepseek_v3 import DeepSeekV3ToolParser
from .hermes import HermesToolParser
from .llama3_json import Llama3JsonToolParser
from .mistral import MistralToolParser
from .qwen3_xml import Qwen3XmlToolParser

__all__ = [
    "DeepSeekV3ToolParser", "ExtractedToolCalls", "HermesToolParser", "Llama3JsonToolParser", "MistralToolParser",
    "ParsedToolCall", "Qwen3XmlToolParser", "StreamingToolCalls", "ToolCallDelta", "ToolParser",
    "get_tool_parser", "register", "tool_parser_names",
]
