"""DeepSeek-V3 tool calls, as its chat template writes them: all calls between
`<｜tool▁calls▁begin｜>` and `<｜tool▁calls▁end｜>`, each one
`<｜tool▁call▁begin｜>function<｜tool▁sep｜>NAME` then its arguments in a ```json fence
and `<｜tool▁call▁end｜>` (vLLM's `deepseek_v3` parser reads the same)."""

from __future__ import annotations

import json
import re
from collections.abc import Sequence
from typing import Any

from ...core.structured_output.grammar import lark_literal
from ...core.structured_output.params import COMPACT_JSON
from .base import ParsedToolCall, register
from .delimited import DelimitedToolParser

SEPARATOR = "<｜tool▁sep｜>"
_BODY = re.compile(r"(?P<type>[^\n]*)" + re.escape(SEPARATOR) + r"(?P<name>[^\n]*)\n```json\n(?P<arguments>.*)\n```",
                   re.DOTALL)


@register("deepseek_v3")
class DeepSeekV3ToolParser(DelimitedToolParser):
    """DeepSeek-V3's `<｜tool▁call▁begin｜>` blocks; text before them is the content."""

    OPEN, CLOSE = "<｜tool▁call▁begin｜>", "<｜tool▁call▁end｜>"
    OUTER = ("<｜tool▁calls▁begin｜>", "<｜tool▁calls▁end｜>")

    def parse_body(self, body: str) -> ParsedToolCall | None:
        match = _BODY.fullmatch(body)
        if match is None:
            return None
        try:
            arguments = json.loads(match["arguments"])
        except json.JSONDecodeError:
            return None
        return ParsedToolCall(match["name"].strip(), json.dumps(arguments, ensure_ascii=False))

    @classmethod
    def body_grammar(cls, tools: Sequence[dict[str, Any]]) -> str:
        # Each tool's arguments are a JSON document of their own, so its $refs resolve as written.
        rules, alternatives = [], []
        for index, tool in enumerate(tools):
            schema = {**(tool.get("parameters") or {"type": "object"}), "x-guidance": COMPACT_JSON}
            head = lark_literal(f"function{SEPARATOR}{tool['name']}\n```json\n")
            alternatives.append(f"call_{index}")
            rules.append(f"call_{index}: {head} arguments_{index} {lark_literal(chr(10) + '```')}")
            rules.append(f"arguments_{index}: %json {json.dumps(schema)}")
        return "body: " + " | ".join(alternatives) + "\n" + "\n".join(rules) + "\n"
