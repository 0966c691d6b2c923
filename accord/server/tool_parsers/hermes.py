"""Hermes / Qwen tool calls: each call is `<tool_call>{"name": ..., "arguments": {...}}</tool_call>`
(the format of the Hermes-2-Pro, Qwen2.5 and Qwen3 chat templates)."""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any

from .base import ParsedToolCall, register, tool_call_schema
from .delimited import DelimitedToolParser


@register("hermes")
@register("qwen")
class HermesToolParser(DelimitedToolParser):
    """`<tool_call>` JSON blocks; text outside them is the message content."""

    OPEN, CLOSE = "<tool_call>", "</tool_call>"

    def parse_body(self, body: str) -> ParsedToolCall | None:
        try:
            call = json.loads(body)
        except json.JSONDecodeError:
            return None
        if not isinstance(call, dict) or not isinstance(call.get("name"), str):
            return None
        arguments = call.get("arguments", call.get("parameters", {}))
        return ParsedToolCall(call["name"], json.dumps(arguments, ensure_ascii=False))

    @classmethod
    def body_grammar(cls, tools: Sequence[dict[str, Any]]) -> str:
        # The model's own layout: the JSON object on a line of its own.
        schema = json.dumps(tool_call_schema(tools, arguments_key="arguments"))
        return f'body: "\\n" json_call "\\n"\njson_call: %json {schema}\n'
