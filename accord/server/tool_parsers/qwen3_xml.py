"""Qwen3-Coder's XML tool calls (vLLM's `qwen3_xml` and `qwen3_coder`, one parser):

    <tool_call>
    <function=get_weather>
    <parameter=city>
    Dallas
    </parameter>
    </function>
    </tool_call>

A parameter's value is bare text (one wrapping newline each side is the template's), so
its JSON type comes from the tool's schema (`schema_types`); a tool or parameter the
request does not define keeps its values as strings. Streamed, the call's name goes out
once `<function=NAME>` is complete and its arguments grow as its parameters arrive: a
string value character by character, any other once it closes (its type may still
change), as vLLM streams them."""

from __future__ import annotations

import json
import re
from collections.abc import Sequence
from typing import Any

from ...core.structured_output.grammar import lark_literal
from ...core.structured_output.params import COMPACT_JSON
from ..streaming import partial_marker_length
from .base import ParsedToolCall, register
from .delimited import DelimitedToolParser
from .schema_types import schema_types, string_choices, typed_value

_FUNCTION = re.compile(r"\s*<function=([^>\n]*)>(.*?)(?:</function>\s*)?$", re.DOTALL)
#: A parameter ends at its closing tag or, unclosed, where the next one opens (vLLM reads it so).
_PARAMETER = re.compile(r"<parameter=([^>]*)>(.*?)(?:</parameter>|(?=<parameter=))", re.DOTALL)
_OPEN_PARAMETER = re.compile(r"<parameter=([^>]*)>(.*)$", re.DOTALL)
_VALUE_ENDS = ("</parameter>", "<parameter=")


def _unwrap(value: str) -> str:
    """The value less the template's one newline each side."""
    return value.removeprefix("\n").removesuffix("\n")


def _member(key: str, value: Any) -> str:
    # Written as json.dumps writes a dict's members, so streamed pieces join into its text.
    return f"{json.dumps(key, ensure_ascii=False)}: {json.dumps(value, ensure_ascii=False)}"


@register("qwen3_xml")
@register("qwen3_coder")
class Qwen3XmlToolParser(DelimitedToolParser):
    """`<tool_call>` blocks of `<function=...>` with `<parameter=...>` values typed by the schema."""

    OPEN, CLOSE = "<tool_call>", "</tool_call>"

    def _typed(self, name: str, values: Sequence[tuple[str, str]]) -> dict[str, Any]:
        """A call's parameter texts as the arguments object its schema types."""
        schema = self.parameters(name)
        properties = (schema or {}).get("properties") or {}
        arguments: dict[str, Any] = {}
        for key, text in values:
            value = _unwrap(text)
            arguments[key] = typed_value(value, properties[key], schema or {}) if key in properties else value
        return arguments

    def parse_body(self, body: str) -> ParsedToolCall | None:
        match = _FUNCTION.fullmatch(body)
        if match is None:
            return None
        name, inner = match[1].strip(), match[2]
        arguments = self._typed(name, _PARAMETER.findall(inner))
        return ParsedToolCall(name, json.dumps(arguments, ensure_ascii=False))

    def partial_body(self, body: str) -> ParsedToolCall | None:
        match = _FUNCTION.fullmatch(body)
        if match is None:
            return None
        name, inner = match[1].strip(), match[2]
        closed = _PARAMETER.findall(inner)
        members = [_member(key, value) for key, value in self._typed(name, closed).items()]
        if len({key for key, _ in closed}) < len(closed):
            return ParsedToolCall(name, "")  # a repeated key moves values: wait for the whole call
        rest = _PARAMETER.sub("", inner)
        opened = _OPEN_PARAMETER.search(rest)
        if opened is not None and self._streams_as_text(name, opened[1]):
            value = opened[2].removeprefix("\n")
            value = value[: len(value) - partial_marker_length(value, _VALUE_ENDS)].removesuffix("\n")
            if value or opened[2].startswith("\n"):
                members.append(f'{json.dumps(opened[1], ensure_ascii=False)}: "' + json.dumps(value, ensure_ascii=False)[1:-1])
        return ParsedToolCall(name, "{" + ", ".join(members) if members else "")

    def _streams_as_text(self, name: str, key: str) -> bool:
        """Whether `key`'s value is a string whatever it says (so it can stream as it comes)."""
        schema = self.parameters(name)
        properties = (schema or {}).get("properties") or {}
        return key not in properties or schema_types(properties[key], schema or {}) == {"string"}

    @classmethod
    def body_grammar(cls, tools: Sequence[dict[str, Any]]) -> str:
        # Parameters in the schema's order, required ones always. A free string is text
        # without "<" that takes the template's closing newline too (a lexeme is matched
        # greedily, so it cannot stop before a newline of its own); an enum of strings
        # is its values; any other value is JSON.
        rules, calls = ["TEXT: /[^<]*/"], []
        closing = lark_literal("\n</parameter>\n")
        for index, tool in enumerate(tools):
            schema = tool.get("parameters") or {"type": "object"}
            definitions = {key: schema[key] for key in ("$defs", "definitions") if key in schema}
            required = set(schema.get("required") or ())
            parts = []
            for number, (key, prop) in enumerate((schema.get("properties") or {}).items()):
                rule, opening = f"p_{index}_{number}", lark_literal(f"<parameter={key}>\n")
                choices = string_choices(prop, schema)
                if choices is not None:
                    values = " | ".join(lark_literal(choice) for choice in choices)
                    rules.append(f"{rule}: {opening} ({values}) {closing}")
                elif schema_types(prop, schema) == {"string"}:
                    rules.append(f"{rule}: {opening} TEXT {lark_literal('</parameter>' + chr(10))}")
                else:
                    rules.append(f"{rule}: {opening} v_{index}_{number} {closing}")
                    rules.append(f"v_{index}_{number}: %json "
                                 f"{json.dumps({**prop, **definitions, 'x-guidance': COMPACT_JSON})}")
                parts.append(rule if key in required else f"{rule}?")
            head = lark_literal(f"\n<function={tool['name']}>\n")
            rules.append(f"call_{index}: {head} {' '.join(parts)} {lark_literal('</function>' + chr(10))}")
            calls.append(f"call_{index}")
        return "body: " + " | ".join(calls) + "\n" + "\n".join(rules) + "\n"
