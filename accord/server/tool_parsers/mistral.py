"""Mistral tool calls (vLLM's `mistral` parser). The calls follow the special token
`[TOOL_CALLS]`, in one of two layouts that the tokenizer's version decides:

- v11 and later (the tokenizer has `[ARGS]`): each call is `[TOOL_CALLS]NAME[ARGS]{...}`,
  several one after another; `NAME{...}` without `[ARGS]` is read too.
- before v11 (Mistral-7B-Instruct-v0.3): `[TOOL_CALLS][{"name": ..., "arguments": {...}}, ...]`.

Text before the first `[TOOL_CALLS]` is the content. The markers are special tokens, so
the server keeps them in the decoded output while it parses calls. Streamed, a v11 call's
name goes out at its `[ARGS]` and its arguments follow as the model writes them; a
pre-v11 array goes out when it is complete."""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from typing import Any

from ...core.structured_output.params import COMPACT_JSON
from ..streaming import partial_marker_length
from .base import ExtractedToolCalls, ParsedToolCall, StreamingToolCalls, ToolCallDelta, ToolParser, register, \
    tool_call_schema

TOOL_CALLS, ARGS = "[TOOL_CALLS]", "[ARGS]"


def _arguments_text(arguments: Any) -> str:
    # vLLM passes string arguments through and writes any other value as JSON.
    return arguments if isinstance(arguments, str) else json.dumps(arguments, ensure_ascii=False)


def _json_calls(text: str) -> list[ParsedToolCall] | None:
    """The calls of a pre-v11 JSON array (or one bare object), or None when it is not one."""
    try:
        parsed, _ = json.JSONDecoder().raw_decode(text.strip())
    except json.JSONDecodeError:
        return None
    entries = parsed if isinstance(parsed, list) else [parsed]
    calls = [ParsedToolCall(entry["name"], _arguments_text(entry.get("arguments", {})))
             for entry in entries if isinstance(entry, dict) and isinstance(entry.get("name"), str)]
    return calls or None


def _split_call(segment: str) -> tuple[str, str] | None:
    """A v11 call's name and arguments text (`NAME[ARGS]{...}` or `NAME{...}`)."""
    name, marker, arguments = segment.partition(ARGS)
    if not marker:
        name, brace, rest = segment.partition("{")
        if not brace:
            return None
        arguments = brace + rest
    return name.strip(), arguments


def _named_calls(segments: Sequence[str]) -> list[ParsedToolCall] | None:
    """The v11 calls, one per segment after a `[TOOL_CALLS]`, or None when one is not a
    call. A name alone is a call without arguments, and text after the arguments' JSON
    is dropped (as vLLM reads both)."""
    calls = []
    for segment in segments:
        name, arguments = _split_call(segment) or (segment.strip(), "{}")
        if not name:
            return None
        try:
            value, _ = json.JSONDecoder().raw_decode(arguments.lstrip())
        except json.JSONDecodeError:
            return None
        calls.append(ParsedToolCall(name, _arguments_text(value)))
    return calls


def _is_json_layout(text: str) -> bool:
    return text.lstrip()[:1] in ("[", "{")


@register("mistral")
class MistralToolParser(ToolParser):
    """`[TOOL_CALLS]` calls in either layout; text before them is the content."""

    KEEPS_SPECIAL_TOKENS = True

    def __init__(self, tools: Sequence[dict[str, Any]] = (), added_tokens: Mapping[str, int] | None = None) -> None:
        super().__init__(tools, added_tokens)
        self._buffer = ""
        #: Set by the first `[TOOL_CALLS]`: "json" (pre-v11) or "named" (v11+), once its layout shows.
        self._layout: str | None = None
        self._in_calls = False
        #: Whether the v11 call under way has sent its name (its arguments stream from then on).
        self._named = False

    @classmethod
    def check_tokenizer(cls, added_tokens: Mapping[str, int]) -> None:
        if TOOL_CALLS not in added_tokens:
            raise ValueError(f"the mistral tool call parser needs the {TOOL_CALLS} token, which this model's tokenizer "
                             "lacks; is this a Mistral model?")

    def extract(self, text: str) -> ExtractedToolCalls:
        content, marker, rest = text.partition(TOOL_CALLS)
        if not marker:
            return ExtractedToolCalls(text or None, [])
        segments = rest.split(TOOL_CALLS)
        calls = _json_calls(rest) if _is_json_layout(rest) else _named_calls(segments)
        if not calls:
            return ExtractedToolCalls(text, [])
        return ExtractedToolCalls(content.strip() or None, calls)

    def feed(self, delta: str) -> StreamingToolCalls:
        self._buffer += delta
        if not self._in_calls:
            before, marker, after = self._buffer.partition(TOOL_CALLS)
            if not marker:
                keep = partial_marker_length(self._buffer, (TOOL_CALLS,))
                content, self._buffer = self._buffer[: len(self._buffer) - keep], self._buffer[len(self._buffer) - keep :]
                return StreamingToolCalls(content, [])
            self._in_calls, self._buffer = True, after
            return StreamingToolCalls(before, self._calls())
        return StreamingToolCalls("", self._calls())

    def _calls(self) -> list[ToolCallDelta]:
        """The pieces of calls the buffer (after the first `[TOOL_CALLS]`) now completes."""
        if self._layout is None:
            if not self._buffer.strip():
                return []
            self._layout = "json" if _is_json_layout(self._buffer) else "named"
        if self._layout == "json":
            calls = _json_calls(self._buffer)
            if calls is None:
                return []  # the array is not complete yet
            self._buffer = ""
            self._layout = "done"
            return self.whole_calls(calls)
        if self._layout == "done":
            self._buffer = ""  # vLLM ignores what follows a complete array
            return []
        pieces = []
        while True:
            if not self._named:
                head, marker, tail = self._buffer.partition(TOOL_CALLS)
                split = _split_call(head)
                if split is None or not split[0]:
                    return pieces
                pieces.append(self.begin_call(split[0]))
                self._named, self._buffer = True, split[1] + marker + tail
            arguments, marker, rest = self._buffer.partition(TOOL_CALLS)
            if not marker:
                keep = partial_marker_length(arguments, (TOOL_CALLS,))
                if arguments[: len(arguments) - keep]:
                    pieces.append(self.continue_call(arguments[: len(arguments) - keep]))
                self._buffer = arguments[len(arguments) - keep :]
                return pieces
            if arguments:
                pieces.append(self.continue_call(arguments))
            self._named, self._buffer = False, rest

    def finish(self) -> StreamingToolCalls:
        rest, self._buffer = self._buffer, ""
        if self._named and rest:
            return StreamingToolCalls("", [self.continue_call(rest)])
        # Text that never became a call (an unfinished array or name) is content, as written.
        if self._layout == "json" and rest:
            return StreamingToolCalls(TOOL_CALLS + rest, [])
        return StreamingToolCalls(rest, [])

    def grammar(self, parallel: bool) -> str:
        tool_calls = f"<[{self.added_tokens[TOOL_CALLS]}]>"
        repeat = "+" if parallel else ""
        if ARGS not in self.added_tokens:  # pre-v11: one JSON array of calls
            envelope = tool_call_schema(self.tools, arguments_key="arguments")
            array = {"type": "array", "items": {"anyOf": envelope["anyOf"]}, "minItems": 1,
                     "$defs": envelope["$defs"], "x-guidance": envelope["x-guidance"]}
            if not parallel:
                array["maxItems"] = 1
            return f"start: {tool_calls} calls\ncalls: %json {json.dumps(array)}\n"
        args = f"<[{self.added_tokens[ARGS]}]>"
        rules, alternatives = [], []
        for index, tool in enumerate(self.tools):
            schema = {**(tool.get("parameters") or {"type": "object"}), "x-guidance": COMPACT_JSON}
            alternatives.append(f"call_{index}")
            rules.append(f"call_{index}: {json.dumps(tool['name'])} {args} arguments_{index}")
            rules.append(f"arguments_{index}: %json {json.dumps(schema)}")
        return (f"start: call{repeat}\ncall: {tool_calls} ({' | '.join(alternatives)})\n" + "\n".join(rules) + "\n")
