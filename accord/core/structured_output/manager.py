"""The scheduler-side owner of every request's grammar matcher and of the per-step
token bitmask; and the sampler-side function that applies a bitmask to logits."""

from __future__ import annotations

import logging
from collections.abc import Sequence
from dataclasses import dataclass

import llguidance
import torch

from .compiler import GrammarCompiler

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
    """Keeps one matcher per constrained request (grammars from a GrammarCompiler),
    advances it as tokens are accepted and fills each step's bitmask."""

    def __init__(self, compiler: GrammarCompiler, eos_token_ids: Sequence[int]) -> None:
        self._compiler = compiler
        self._eos_token_ids = list(eos_token_ids)
        self._executor: llguidance.LLExecutor | None = None
        self._matchers: dict[str, llguidance.LLMatcher] = {}

    def add(self, seq_id: str, grammar: str) -> None:
        """Start constraining `seq_id` by a grammar from `compile`."""
        self._matchers[seq_id] = llguidance.LLMatcher(self._compiler.ll_tokenizer, grammar)

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

        bitmask = lltorch.allocate_token_bitmask(len(constrained), self._compiler.ll_tokenizer.vocab_size)
        if self._executor is None:
            self._executor = llguidance.LLExecutor()
        pairs = [(self._matchers[seq_id], row) for row, seq_id in enumerate(constrained)]
        lltorch.fill_next_token_bitmask_par(self._executor, pairs, bitmask)
        return GrammarBitmask(constrained, bitmask)
