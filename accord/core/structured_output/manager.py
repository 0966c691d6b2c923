"""The engine-side owner of every sequence's grammar matcher and of the per-step token
bitmask; and the sampler-side function that applies a bitmask to logits."""

from __future__ import annotations

import logging
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

import llguidance
import torch

from .grammar import grammar_source
from .params import StructuredOutputsParams
from .tokenizer import ll_tokenizer

if TYPE_CHECKING:
    from ..model_loader.tokenizer import Tokenizer

logger = logging.getLogger("accord.engine")

#: Bit b of word w allows token 32 * w + b.
_BITS = torch.arange(32, dtype=torch.int32)


@dataclass(frozen=True)
class GrammarBitmask:
    """A step's token bitmask: row i (int32 words, llguidance's layout) holds the
    tokens sequence `seq_ids[i]` may sample."""

    seq_ids: list[str]
    bitmask: torch.Tensor


def apply_token_bitmask(logits: torch.Tensor, row_of: dict[str, int], mask: GrammarBitmask) -> torch.Tensor:
    """`logits` with the tokens each masked sequence may not sample set to -inf;
    `row_of` maps a sequence id to its row of `logits`. Plain torch ops, so it runs on
    every backend's device."""
    rows = [(row_of[seq_id], i) for i, seq_id in enumerate(mask.seq_ids) if seq_id in row_of]
    if not rows:
        return logits
    logit_rows = torch.tensor([r for r, _ in rows], device=logits.device)
    words = mask.bitmask[[i for _, i in rows]]
    allowed = ((words[:, :, None] >> _BITS) & 1).reshape(len(rows), -1)[:, : logits.shape[1]].bool()
    logits = logits.clone()
    logits[logit_rows] = logits[logit_rows].masked_fill(~allowed.to(logits.device), float("-inf"))
    return logits


class StructuredOutputManager:
    """Compiles requests' constraints, keeps one matcher per constrained sequence,
    advances it as tokens are accepted and fills each step's bitmask."""

    def __init__(self, tokenizer: Tokenizer, vocab_size: int, eos_token_ids: Sequence[int]) -> None:
        self._tokenizer = tokenizer
        self._vocab_size = vocab_size
        self._eos_token_ids = list(eos_token_ids)
        self._ll_tokenizer: llguidance.LLTokenizer | None = None
        self._executor: llguidance.LLExecutor | None = None
        self._matchers: dict[str, llguidance.LLMatcher] = {}

    @property
    def ll_tokenizer(self) -> llguidance.LLTokenizer:
        """llguidance's view of the tokenizer, built on first use (about a second for
        a large vocabulary, so servers that never constrain never pay it)."""
        if self._ll_tokenizer is None:
            self._ll_tokenizer = ll_tokenizer(self._tokenizer, self._vocab_size)
            self._executor = llguidance.LLExecutor()
        return self._ll_tokenizer

    def compile(self, params: StructuredOutputsParams) -> str:
        """The checked grammar for `params`; ValueError naming the problem when it
        does not compile (a bad schema, regex or grammar)."""
        try:
            source = grammar_source(params)
        except Exception as error:  # llguidance reports bad input with several exception types
            raise ValueError(f"the structured output constraint is invalid: {error}") from None
        is_error, messages = llguidance.LLMatcher.validate_grammar_with_warnings(source, self.ll_tokenizer)
        if is_error:
            raise ValueError(f"the structured output constraint is invalid: {messages[0]}")
        return source

    def add(self, seq_id: str, grammar: str) -> None:
        """Start constraining `seq_id` by a grammar from `compile`."""
        self._matchers[seq_id] = llguidance.LLMatcher(self.ll_tokenizer, grammar)

    def remove(self, seq_id: str) -> None:
        """Forget `seq_id` (finished or aborted); unknown ids are ignored."""
        self._matchers.pop(seq_id, None)

    def is_constrained(self, seq_id: str) -> bool:
        """Whether `seq_id` has a matcher."""
        return seq_id in self._matchers

    def accept(self, seq_id: str, token_id: int) -> bool:
        """Advance `seq_id`'s matcher by a sampled token. Returns True when the
        grammar is complete (nothing but the end may follow), so the sequence stops."""
        matcher = self._matchers.get(seq_id)
        if matcher is None:
            return False
        if token_id not in self._eos_token_ids and not matcher.consume_token(token_id):
            # The mask made this impossible; if it happens anyway, stop rather than
            # constrain the rest against a broken state.
            logger.error("structured output: token %d was refused for %s: %s", token_id, seq_id, matcher.get_error())
            return True
        return matcher.is_stopped()

    def grammar_bitmask(self, seq_ids: Sequence[str]) -> GrammarBitmask | None:
        """The bitmask for those of `seq_ids` that are constrained (None if none),
        filled in parallel by llguidance's thread pool."""
        constrained = [seq_id for seq_id in seq_ids if seq_id in self._matchers]
        if not constrained:
            return None
        # Imported on first use: llguidance.torch imports torch's compiler stack, seconds
        # of every engine's start-up otherwise, constrained requests or not.
        import llguidance.torch as lltorch

        bitmask = lltorch.allocate_token_bitmask(len(constrained), self.ll_tokenizer.vocab_size)
        assert self._executor is not None
        pairs = [(self._matchers[seq_id], row) for row, seq_id in enumerate(constrained)]
        lltorch.fill_next_token_bitmask_par(self._executor, pairs, bitmask)
        return GrammarBitmask(constrained, bitmask)
