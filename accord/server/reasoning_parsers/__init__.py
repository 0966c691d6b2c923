"""Reasoning parsers by name (vLLM's `--reasoning-parser` names): each splits a
reasoning model's output into the thinking (`reasoning_content`) and the answer
(`content`), whole or streamed, and names the marker tokens the engine needs to tell
the two apart (thinking budgets, grammars and tool calls apply to the answer only).

Add a parser by subclassing ReasoningParser and decorating it with `@register("name")`.
"""

from __future__ import annotations

from .base import ReasoningParser, ReasoningSplit, get_reasoning_parser, reasoning_parser_names, register
from .think_tags import ThinkTagReasoningParser

__all__ = [
    "ReasoningParser", "ReasoningSplit", "ThinkTagReasoningParser",
    "get_reasoning_parser", "reasoning_parser_names", "register",
]
