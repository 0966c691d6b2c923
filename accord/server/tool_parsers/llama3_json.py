"""Llama 3.1-3.3 JSON tool calls, as their chat template asks for them: the whole
answer is `{"name": ..., "parameters": {...}}` (several joined by "; "), optionally
after `<|python_tag|>` (vLLM's `llama3_json` parser reads the same). An answer that does
not open with a call is text; one that opens like a call is held back until it ends."""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from typing import Any

from ...core.structured_output.grammar import lark_literal
from .base import ExtractedToolCalls, ParsedToolCall, StreamingToolCalls, ToolParser, register, tool_call_schema

PYTHON_TAG = "<|python_tag|>"
SEPARATOR = "; "


def _parse_calls(text: str) -> list[ParsedToolCall] | None:
    """The calls `text` (after the tag) writes, or None when it is not all calls."""
    decoder, calls, position = json.JSONDecoder(), [], 0
    while True:
        try:
            call, position = decoder.raw_decode(text, position)
        except json.JSONDecodeError:
            return None
        if not isinstance(call, dict) or not isinstance(call.get("name"), str):
            return None
        calls.append(ParsedToolCall(call["name"], json.dumps(call.get("parameters", call.get("arguments", {})),
                                                             ensure_ascii=False)))
        rest = text[position:].lstrip()
        if not rest:
            return calls
        if not rest.startswith(";"):
            return None
        position = len(text) - len(rest) + 1
        while position < len(text) and text[position].isspace():
            position += 1


def _call_text(text: str) -> str | None:
    """What follows the tag when `text` opens a call (it may still be growing)."""
    stripped = text.lstrip()
    if stripped.startswith(PYTHON_TAG):
        return stripped[len(PYTHON_TAG):]
    return stripped if stripped.startswith("{") else None


@register("llama3_json")
class Llama3JsonToolParser(ToolParser):
    """A whole answer of JSON calls; any other answer is content."""

    def __init__(self, tools: Sequence[dict[str, Any]] = (), added_tokens: Mapping[str, int] | None = None) -> None:
        super().__init__(tools, added_tokens)
        self._buffer = ""
        #: None until the answer's start tells; then "text" or "call".
        self._kind: str | None = None

    def extract(self, text: str) -> ExtractedToolCalls:
        body = _call_text(text)
        calls = _parse_calls(body) if body is not None else None
        return ExtractedToolCalls(None, calls) if calls else ExtractedToolCalls(text or None, [])

    def feed(self, delta: str) -> StreamingToolCalls:
        self._buffer += delta
        if self._kind is None:
            start = self._buffer.lstrip()
            if not start or PYTHON_TAG.startswith(start):
                return StreamingToolCalls("", [])  # cannot tell yet
            self._kind = "call" if _call_text(self._buffer) is not None else "text"
        if self._kind == "call":
            return StreamingToolCalls("", [])  # held until the answer ends
        text, self._buffer = self._buffer, ""
        return StreamingToolCalls(text, [])

    def finish(self) -> StreamingToolCalls:
        rest, self._buffer = self._buffer, ""
        extracted = self.extract(rest)
        return StreamingToolCalls(extracted.content or "", self.whole_calls(extracted.calls))

    def grammar(self, parallel: bool) -> str:
        schema = json.dumps(tool_call_schema(self.tools, arguments_key="parameters"))
        more = f" ({lark_literal(SEPARATOR)} call)*" if parallel else ""
        return f"start: call{more}\ncall: %json {schema}\n"
