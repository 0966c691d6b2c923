"""The reasoning-parser interface and its registry."""

from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass
from typing import Protocol

from ..parser_registry import ParserRegistry
from ...core.thinking import ThinkingMarkers

class TextEncoder(Protocol):
    """What a parser reads of the model's tokenizer: how it encodes a marker."""

    def encode(self, text: str, add_special_tokens: bool = True) -> list[int]: ...


@dataclass(frozen=True)
class ReasoningSplit:
    """Output text split into the thinking and the answer (None: none of that part)."""

    reasoning: str | None
    content: str | None


class ReasoningParser(ABC):
    """Reads one model family's thinking format; a fresh instance per choice (the
    streaming state is the instance's). `thinking` says whether the output begins inside
    the thinking, as the prompt left it (`ThinkingMarkers.thinks_after`)."""

    def __init__(self, thinking: bool) -> None:
        self.thinking = thinking

    @classmethod
    @abstractmethod
    def markers(cls, tokenizer: TextEncoder) -> ThinkingMarkers:
        """The family's marker token ids in `tokenizer`; ValueError when it lacks them."""

    @abstractmethod
    def extract(self, text: str) -> ReasoningSplit:
        """The thinking and the answer of a whole output."""

    @abstractmethod
    def feed(self, delta: str) -> ReasoningSplit:
        """Take the next piece of streamed output; text that may still turn out to be a
        marker is held back until it is known."""

    @abstractmethod
    def finish(self) -> ReasoningSplit:
        """The end of the stream: whatever was held back."""


_REGISTRY: ParserRegistry[type[ReasoningParser]] = ParserRegistry("reasoning parser")
#: Class decorator adding a parser to the registry under a name.
register = _REGISTRY.register
#: The registered parsers' names, sorted.
reasoning_parser_names = _REGISTRY.names
#: The parser registered under a name; ValueError listing the known ones otherwise.
get_reasoning_parser = _REGISTRY.get
