"""What the chat endpoint needs to serve a reasoning model: the parser that splits
thinking from answer (--reasoning-parser), the marker ids the engine tells them apart by,
and the thinking budget each `reasoning_effort` maps to (--reasoning-budgets)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Protocol

from ..core.thinking import ThinkingMarkers
from .errors import OpenAIError
from .protocol import ChatCompletionRequest
from .reasoning_parsers import ReasoningParser, get_reasoning_parser
from .reasoning_parsers.base import TextEncoder


class ServedTokenizer(TextEncoder, Protocol):
    """What the reasoning setup reads of the model's tokenizer: its marker ids and its EOS ids."""

    eos_token_ids: Sequence[int]


@dataclass(frozen=True)
class ServedReasoning:
    """A reasoning model's parser, its marker ids, and the budget per effort level."""

    parser: type[ReasoningParser]
    markers: ThinkingMarkers
    budgets: Mapping[str, int]

    def budget(self, request: ChatCompletionRequest) -> int | None:
        """The request's thinking budget: its `thinking_token_budget`, else its
        `reasoning_effort`'s budget, else none."""
        if request.thinking_token_budget is not None:
            return request.thinking_token_budget
        if request.reasoning_effort is None:
            return None
        try:
            return self.budgets[request.reasoning_effort]
        except KeyError:
            raise OpenAIError(
                f"reasoning_effort {request.reasoning_effort!r} has no budget on this server (--reasoning-budgets "
                f"sets {', '.join(sorted(self.budgets)) or 'none'})", param="reasoning_effort",
            ) from None

    def parser_for(self, prompt_token_ids: Sequence[int]) -> ReasoningParser:
        """A parser for one choice of this prompt's output."""
        return self.parser(thinking=self.markers.thinks_after(prompt_token_ids))


def served_reasoning(
    parser_name: str | None, budgets: Mapping[str, int], tokenizer: ServedTokenizer
) -> ServedReasoning | None:
    """The reasoning setup of a server started with --reasoning-parser `parser_name`
    (None without one); ValueError when the model's tokenizer lacks the parser's markers.
    The tokenizer's EOS ids end a turn (chat templates close each turn with one)."""
    if parser_name is None:
        return None
    parser = get_reasoning_parser(parser_name)
    markers = replace(parser.markers(tokenizer), turn_end_ids=frozenset(tokenizer.eos_token_ids))
    return ServedReasoning(parser, markers, dict(budgets))


def refuse_reasoning_fields(request: ChatCompletionRequest) -> None:
    """A server without a reasoning parser cannot budget thinking: say so, with a 400
    naming the field, rather than ignore it."""
    for name in ("thinking_token_budget", "reasoning_effort"):
        if getattr(request, name) is not None:
            raise OpenAIError(f"{name} needs a reasoning model served with --reasoning-parser", param=name,
                              code="unsupported_parameter")
