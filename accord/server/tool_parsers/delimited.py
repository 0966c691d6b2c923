"""Tool-call formats where each call sits between an opening and a closing marker
(Hermes/Qwen's `<tool_call>`, DeepSeek-V3's `<｜tool▁call▁begin｜>`), optionally inside
an outer pair around all the calls: the splitting of text and calls, whole and
streamed, and the grammar's frame are shared; a format gives its markers, how a
call's body reads, and the grammar of a body."""

from __future__ import annotations

from abc import abstractmethod
from collections.abc import Mapping, Sequence
from typing import Any

from ...core.structured_output.grammar import lark_literal
from ..streaming import partial_marker_length
from .base import ExtractedToolCalls, ParsedToolCall, StreamingToolCalls, ToolCallDelta, ToolParser


class DelimitedToolParser(ToolParser):
    """Calls between OPEN and CLOSE; text outside them (less the outer markers) is the
    message content. A body that does not parse stays in the content as text."""

    OPEN: str
    CLOSE: str
    #: Markers around all of a message's calls (removed from the content), if any.
    OUTER: tuple[str, str] = ("", "")

    def __init__(self, tools: Sequence[dict[str, Any]] = (), added_tokens: Mapping[str, int] | None = None) -> None:
        super().__init__(tools, added_tokens)
        self._buffer = ""
        #: The streamed arguments of the call under way, once its name is out (None before).
        self._streamed: str | None = None

    @abstractmethod
    def parse_body(self, body: str) -> ParsedToolCall | None:
        """The call a body (the text between the markers) writes, or None."""

    def partial_body(self, body: str) -> ParsedToolCall | None:
        """While a call is still arriving: its name and the part of its arguments text
        that the finished call's arguments are sure to begin with, once the name is
        known. None (the default) keeps the whole call until its closing marker."""
        return None

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
            if end < 0:  # inside a call: what of it is sure so far, then wait for its end
                self._buffer = self._buffer[start:]
                calls += self._stream_partial(self.partial_body(self._buffer[len(self.OPEN) :]))
                break
            call = self.parse_body(self._buffer[start + len(self.OPEN) : end])
            if call is None:
                content.append(self._buffer[start : end + len(self.CLOSE)])
            else:
                calls += self._stream_rest(call)
            self._buffer = self._buffer[end + len(self.CLOSE) :]
        return StreamingToolCalls(self._content("".join(content)), calls)

    def _stream_partial(self, partial: ParsedToolCall | None) -> list[ToolCallDelta]:
        """The new pieces of a call still arriving."""
        if partial is None:
            return []
        if self._streamed is None:
            self._streamed = partial.arguments
            return [self.begin_call(partial.name, partial.arguments)]
        grown = partial.arguments[len(self._streamed) :]
        if not grown or not partial.arguments.startswith(self._streamed):
            return []
        self._streamed = partial.arguments
        return [self.continue_call(grown)]

    def _stream_rest(self, call: ParsedToolCall) -> list[ToolCallDelta]:
        """A finished call's pieces not yet streamed."""
        streamed, self._streamed = self._streamed, None
        if streamed is None:
            return self.whole_calls([call])
        # partial_body promises a prefix; the finished call's own text wins if it broke that.
        rest = call.arguments[len(streamed) :] if call.arguments.startswith(streamed) else call.arguments
        return [self.continue_call(rest)] if rest else []

    def finish(self) -> StreamingToolCalls:
        rest, self._buffer = self._buffer, ""
        if self._streamed is not None:
            # A call cut off after its name went out: its body stays open as it was.
            self._streamed = None
            return StreamingToolCalls("", [])
        return StreamingToolCalls(rest, [])

    def grammar(self, parallel: bool) -> str:
        repeat = "+" if parallel else ""
        opening, closing = (f"{lark_literal(marker)} " if marker else "" for marker in self.OUTER)
        return (
            f"start: {opening}call{repeat} {closing}\n"
            f"call: {lark_literal(self.OPEN)} body {lark_literal(self.CLOSE)}\n"
            f"{self.body_grammar(self.tools)}"
        )
