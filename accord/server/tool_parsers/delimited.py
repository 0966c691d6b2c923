"""Tool-call formats where each call sits between an opening and a closing marker
(Hermes/Qwen's `<tool_call>`, DeepSeek-V3's `<｜tool▁call▁begin｜>`), optionally inside
an outer pair around all the calls: the splitting of text and calls, whole and
streamed, and the grammar's frame are shared; a format gives its markers, how a
call's body reads, and the grammar of a body."""

from __future__ import annotations

from abc import abstractmethod
from collections.abc import Sequence
from typing import Any

from ...core.structured_output.grammar import lark_literal
from ..streaming import partial_marker_length
from .base import ExtractedToolCalls, ParsedToolCall, StreamingToolCalls, ToolParser


class DelimitedToolParser(ToolParser):
    """Calls between OPEN and CLOSE; text outside them (less the outer markers) is the
    message content. A body that does not parse stays in the content as text."""

    OPEN: str
    CLOSE: str
    #: Markers around all of a message's calls (removed from the content), if any.
    OUTER: tuple[str, str] = ("", "")

    def __init__(self) -> None:
        self._buffer = ""

    @classmethod
    @abstractmethod
    def parse_body(cls, body: str) -> ParsedToolCall | None:
        """The call a body (the text between the markers) writes, or None."""

    @classmethod
    @abstractmethod
    def body_grammar(cls, tools: Sequence[dict[str, Any]]) -> str:
        """Lark rules defining `body`: a call to one of `tools` with arguments matching its schema."""

    @classmethod
    def _content(cls, text: str) -> str:
        for marker in cls.OUTER:
            if marker:
                text = text.replace(marker, "")
        return text

    def extract(self, text: str) -> ExtractedToolCalls:
        calls, content_parts, end = [], [], 0
        start = text.find(self.OPEN)
        while start >= 0:
            close = text.find(self.CLOSE, start + len(self.OPEN))
            if close < 0:
                break
            call = self.parse_body(text[start + len(self.OPEN) : close])
            if call is not None:
                calls.append(call)
                content_parts.append(text[end:start])
                end = close + len(self.CLOSE)
            start = text.find(self.OPEN, close + len(self.CLOSE))
        content_parts.append(text[end:])
        content = self._content("".join(content_parts)).strip() if calls else text
        return ExtractedToolCalls(content or None, calls)

    def feed(self, delta: str) -> StreamingToolCalls:
        self._buffer += delta
        content, calls = [], []
        while True:
            start = self._buffer.find(self.OPEN)
            if start < 0:
                keep = partial_marker_length(self._buffer, (self.OPEN, *self.OUTER))
                content.append(self._buffer[: len(self._buffer) - keep])
                self._buffer = self._buffer[len(self._buffer) - keep :]
                break
            content.append(self._buffer[:start])
            end = self._buffer.find(self.CLOSE, start + len(self.OPEN))
            if end < 0:  # inside a call: wait for its end
                self._buffer = self._buffer[start:]
                break
            call = self.parse_body(self._buffer[start + len(self.OPEN) : end])
            if call is None:
                content.append(self._buffer[start : end + len(self.CLOSE)])
            else:
                calls.append(call)
            self._buffer = self._buffer[end + len(self.CLOSE) :]
        return StreamingToolCalls(self._content("".join(content)), calls)

    def finish(self) -> StreamingToolCalls:
        rest, self._buffer = self._buffer, ""
        return StreamingToolCalls(rest, [])

    @classmethod
    def grammar(cls, tools: Sequence[dict[str, Any]], parallel: bool) -> str:
        repeat = "+" if parallel else ""
        opening, closing = (f"{lark_literal(marker)} " if marker else "" for marker in cls.OUTER)
        return (
            f"start: {opening}call{repeat} {closing}\n"
            f"call: {lark_literal(cls.OPEN)} body {lark_literal(cls.CLOSE)}\n"
            f"{cls.body_grammar(tools)}"
        )
