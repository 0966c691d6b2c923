"""Incremental detokenisation and stop strings, one sequence at a time.

Each new token's text is the difference between decoding a short window that ends
with it and the same window without it, so multi-token characters and byte-level
merges come out right; text that ends in an incomplete character (U+FFFD) waits for
the next token. Stop strings are searched only where new text could complete one.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol

#: Prompt tokens kept in the decode window, so the first output token decodes in context.
PROMPT_CONTEXT_TOKENS = 5


class Decoder(Protocol):
    """What detokenisation needs of a tokenizer."""

    def decode(self, token_ids: Sequence[int], skip_special_tokens: bool = True) -> str: ...


class IncrementalDetokenizer:
    """Turns a sequence's output tokens into text as they arrive and finds stop strings.

    `token_ids` is the sequence's live token list (prompt then outputs); the detokenizer
    reads it, never writes it.
    """

    def __init__(
        self,
        tokenizer: Decoder,
        token_ids: list[int],
        num_prompt_tokens: int,
        stop: Sequence[str] = (),
        include_stop_str_in_output: bool = False,
        skip_special_tokens: bool = True,
    ) -> None:
        self.tokenizer = tokenizer
        self.token_ids = token_ids
        self.stop = tuple(stop)
        self.include_stop_str_in_output = include_stop_str_in_output
        self.skip_special_tokens = skip_special_tokens
        self.prefix_offset = max(0, num_prompt_tokens - PROMPT_CONTEXT_TOKENS)
        self.read_offset = num_prompt_tokens
        self.output_text = ""
        # While running, hold back text that could still become a stop string, so a
        # streamed prefix of a stop string is never shown.
        self.holdback = 0 if include_stop_str_in_output else max((len(s) for s in self.stop), default=1) - 1

    def update(self, find_stop: bool = True) -> str | None:
        """Decode the tokens appended since the last call; return the stop string the
        new text completes (the text is cut there), or None. `find_stop` False (before
        min_tokens) skips the search."""
        prefix = self.tokenizer.decode(
            self.token_ids[self.prefix_offset : self.read_offset], skip_special_tokens=self.skip_special_tokens
        )
        window = self.tokenizer.decode(
            self.token_ids[self.prefix_offset :], skip_special_tokens=self.skip_special_tokens
        )
        if len(window) <= len(prefix) or window.endswith("\ufffd"):
            return None
        new_text = window[len(prefix) :]
        self.prefix_offset, self.read_offset = self.read_offset, len(self.token_ids)
        self.output_text += new_text
        return self._cut_at_stop_string(len(new_text)) if find_stop else None

    def visible_text(self, finished: bool) -> str:
        """The text to report: all of it once finished (a last incomplete character as
        U+FFFD, as vLLM: the text still decodes from the token ids), else minus the
        held-back tail."""
        if finished:
            return self.output_text + self._undecoded_tail()
        if not self.holdback:
            return self.output_text
        return self.output_text[: max(0, len(self.output_text) - self.holdback)]

    def _undecoded_tail(self) -> str:
        """The text of the tokens still waiting for the rest of a character."""
        if self.read_offset >= len(self.token_ids):
            return ""
        prefix = self.tokenizer.decode(
            self.token_ids[self.prefix_offset : self.read_offset], skip_special_tokens=self.skip_special_tokens
        )
        window = self.tokenizer.decode(self.token_ids[self.prefix_offset :], skip_special_tokens=self.skip_special_tokens)
        return window[len(prefix) :] if len(window) > len(prefix) else ""

    def _cut_at_stop_string(self, new_chars: int) -> str | None:
        text = self.output_text
        best: tuple[int, str] | None = None
        for stop in self.stop:
            found = text.find(stop, max(0, len(text) - new_chars - len(stop) + 1))
            if found != -1 and (best is None or found < best[0]):
                best = (found, stop)
        if best is None:
            return None
        found, stop = best
        self.output_text = text[: found + (len(stop) if self.include_stop_str_in_output else 0)]
        return stop
