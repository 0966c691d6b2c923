"""A registry of parser classes by name (the tool-call and reasoning parsers use one
each): a class decorator adds a parser, and an unknown name is answered with the known
ones."""

from __future__ import annotations

from collections.abc import Callable
from typing import Generic, TypeVar

T = TypeVar("T")


class ParserRegistry(Generic[T]):
    """Parser classes of one kind (`kind` names it in errors: "tool call parser")."""

    def __init__(self, kind: str) -> None:
        self.kind = kind
        self._parsers: dict[str, T] = {}

    def register(self, name: str) -> Callable[[T], T]:
        """Class decorator adding a parser under `name`."""

        def add(parser: T) -> T:
            self._parsers[name] = parser
            return parser

        return add

    def names(self) -> list[str]:
        """The registered parsers' names, sorted."""
        return sorted(self._parsers)

    def get(self, name: str) -> T:
        """The parser registered as `name`; ValueError listing the known ones otherwise."""
        try:
            return self._parsers[name]
        except KeyError:
            raise ValueError(f"unknown {self.kind} {name!r}; known: {', '.join(self.names())}") from None
