"""`<think>...</think>` reasoning, as DeepSeek-R1 and Qwen3 write it (vLLM's
`deepseek_r1` and `qwen3` parsers read the same): the thinking is everything before
`</think>`, less a `<think>` the model writes itself (DeepSeek-R1's template puts it in
the prompt; Qwen3's, up to its 2507 release, has the model write it). An output cut off
before `</think>` is all thinking; one whose prompt already closed the thinking (Qwen3's
`enable_thinking=False`) is all answer."""

from __future__ import annotations

from ...core.thinking import ThinkingMarkers
from ..streaming import partial_marker_length
from .base import ReasoningParser, ReasoningSplit, TextEncoder, register


def _split(reasoning: str, content: str) -> ReasoningSplit:
    return ReasoningSplit(reasoning or None, content or None)


@register("deepseek_r1")
@register("qwen3")
class ThinkTagReasoningParser(ReasoningParser):
    """Thinking between `<think>` (in the prompt or the output) and `</think>`."""

    START, END = "<think>", "</think>"

    def __init__(self, thinking: bool) -> None:
        super().__init__(thinking)
        self._buffer = ""
        #: Whether a `<think>` the model writes may still come (only before any thinking text).
        self._start_possible = True

    @classmethod
    def markers(cls, tokenizer: TextEncoder) -> ThinkingMarkers:
        ids = []
        for marker in (cls.START, cls.END):
            encoded = tokenizer.encode(marker, add_special_tokens=False)
            if len(encoded) != 1:
                raise ValueError(f"this reasoning parser needs {marker!r} as one token, but the model's tokenizer "
                                 f"splits it into {len(encoded)}; is this a DeepSeek-R1 or Qwen3 model?")
            ids.append(encoded[0])
        return ThinkingMarkers(start_id=ids[0], end_id=ids[1])

    def extract(self, text: str) -> ReasoningSplit:
        if not self.thinking:
            return _split("", text)
        before, start, after = text.partition(self.START)
        text = after if start and not before.strip() else text
        reasoning, end, content = text.partition(self.END)
        return _split(reasoning, content) if end else _split(text, "")

    def feed(self, delta: str) -> ReasoningSplit:
        if not self.thinking:
            return _split("", self._take_all(delta))
        self._buffer += delta
        if self._start_possible:
            if self.START.startswith(self._buffer.lstrip()):
                return _split("", "")  # maybe the model's own `<think>`: wait
            self._drop_opening()
        reasoning, end, content = self._buffer.partition(self.END)
        if end:
            self.thinking, self._buffer = False, ""
            return _split(reasoning, content)
        keep = partial_marker_length(self._buffer, (self.END,))
        reasoning, self._buffer = self._buffer[: len(self._buffer) - keep], self._buffer[len(self._buffer) - keep :]
        return _split(reasoning, "")

    def finish(self) -> ReasoningSplit:
        if self.thinking and self._start_possible:
            self._drop_opening()
        rest, self._buffer = self._buffer, ""
        return _split(rest, "") if self.thinking else _split("", rest)

    def _drop_opening(self) -> None:
        """Settle whether the output opened with the model's own `<think>` (dropped)."""
        self._start_possible = False
        stripped = self._buffer.lstrip()
        if stripped.startswith(self.START):
            self._buffer = stripped[len(self.START):]

    def _take_all(self, delta: str) -> str:
        rest, self._buffer = self._buffer + delta, ""
        return rest
