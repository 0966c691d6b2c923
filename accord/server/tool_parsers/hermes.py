"""Hermes / Qwen tool calls: each call is `<tool_call>{"name": ..., "arguments": {...}}</tool_call>`
(the format of the Hermes-2-Pro, Qwen2.5 and Qwen3 chat templates)."""

from __future__ import annotations

import json
import re
from collections.abc import Sequence
from typing import Any

from ...core.structured_output.grammar import lark_literal
from .base import ExtractedToolCalls, ParsedToolCall, StreamingToolCalls, ToolParser, register, tool_call_schema

OPEN, CLOSE = "<tool_call>", "</tool_call>"
_CALL = re.compile(re.escape(OPEN) + r"(.*?)" + re.escape(CLOSE), re.DOTALL)


def _parse(body: str) -> ParsedToolCall | None:
    try:
        call = json.loads(body)
    except json.JSONDecodeError:
        return None
    if not isinstance(call, dict) or not isinstance(call.get("name"), str):
        return None
    arguments = call.get("arguments", call.get("parameters", {}))
    return ParsedToolCall(call["name"], json.dumps(arguments, ensure_ascii=False))


def _held_back(text: str) -> int:
    """How many trailing characters of `text` could be the start of OPEN."""
    for size in range(min(len(OPEN) - 1, len(text)), 0, -1):
        if OPEN.startswith(text[-size:]):
            return size
    return 0


@register("hermes")
@register("qwen")
class HermesToolParser(ToolParser):
    """`<tool_call>` JSON blocks; text outside them is the message content."""

    def __init__(self) -> None:
        self._buffer = ""

    def extract(self, text: str) -> ExtractedToolCalls:
        calls, content_parts, end = [], [], 0
        for match in _CALL.finditer(text):
            call = _parse(match.group(1))
            if call is None:  # not a well-formed call: leave it in the content
                continue
            calls.append(call)
            content_parts.append(text[end : match.start()])
            end = match.end()
        content_parts.append(text[end:])
        content = "".join(content_parts).strip() if calls else text
        return ExtractedToolCalls(content or None, calls)

    def feed(self, delta: str) -> StreamingToolCalls:
        self._buffer += delta
        content, calls = [], []
        while True:
            start = self._buffer.find(OPEN)
            if start < 0:
                keep = _held_back(self._buffer)
                content.append(self._buffer[: len(self._buffer) - keep])
                self._buffer = self._buffer[len(self._buffer) - keep :]
                break
            content.append(self._buffer[:start])
            end = self._buffer.find(CLOSE, start)
            if end < 0:  # inside a call: wait for its end
                self._buffer = self._buffer[start:]
                break
            call = _parse(self._buffer[start + len(OPEN) : end])
            if call is None:
                content.append(self._buffer[start : end + len(CLOSE)])
            else:
                calls.append(call)
            self._buffer = self._buffer[end + len(CLOSE) :]
        return StreamingToolCalls("".join(content), calls)

    def finish(self) -> StreamingToolCalls:
        rest, self._buffer = self._buffer, ""
        return StreamingToolCalls(rest, [])

    @classmethod
    def grammar(cls, tools: Sequence[dict[str, Any]], parallel: bool) -> str:
        body = json.dumps(tool_call_schema(tools, arguments_key="arguments"))
        repeat = "+" if parallel else ""
        return (
            f"start: call{repeat}\n"
            f"call: {lark_literal(OPEN + chr(10))} body {lark_literal(chr(10) + CLOSE)}\n"
            f"body: %json {body}\n"
        )
