"""The proposers: from a request's own tokens (prompt then output), the tokens that
likely come next, for the target model to check in one forward.

ngram (prompt lookup, vLLM's): the tokens that followed the latest earlier copy of the
longest tail of n tokens, prompt_lookup_min <= n <= prompt_lookup_max. suffix (suffix
decoding, after Arctic's): the longest tail (up to suffix_decoding_max_tree_depth
tokens) that occurred before, continued token by token with the continuation most of
its copies share, while at least suffix_decoding_min_token_prob of them agree (a walk
down the suffix tree of the request's tokens, by count); it proposes long runs where
text repeats and few tokens where it does not.
"""

from __future__ import annotations

from typing import Protocol

import numpy as np

from ..sampling_params import SamplingParams
from .config import SpeculativeConfig
from .matching import RequestTailIndexes


class Proposer(Protocol):
    """Drafts up to `num_speculative_tokens` tokens after a token history."""

    def propose(self, history: np.ndarray, req_id: str | None = None) -> list[int]:
        """The drafted tokens after `history` (1-D token ids), possibly none; with the
        request's id, from what the proposer kept of its history (which only grows)."""
        ...

    def forget(self, req_id: str) -> None:
        """The request left the batch: drop what was kept of its history."""
        ...


class _TailProposer:
    """A proposer from where the request's tail occurred before: it keeps each request's
    match lengths (`RequestTailIndexes`), updated with only the tokens new since."""

    def __init__(self, k: int, max_match: int) -> None:
        self.k = k
        self._indexes = RequestTailIndexes(max_match)

    def forget(self, req_id: str) -> None:
        """The request left the batch: drop its match lengths."""
        self._indexes.forget(req_id)

    def _matches(self, history: np.ndarray, req_id: str | None) -> tuple[np.ndarray, int]:
        """The history's match lengths (per earlier position) and the longest (0: none)."""
        lengths = self._indexes.lengths(history, req_id)
        return lengths, int(lengths.max()) if len(lengths) else 0


class NgramProposer(_TailProposer):
    """Prompt lookup: continue the latest earlier copy of the longest matching n-gram."""

    def __init__(self, config: SpeculativeConfig) -> None:
        super().__init__(config.num_speculative_tokens, config.prompt_lookup_max)
        self.min_n = config.prompt_lookup_min

    def propose(self, history: np.ndarray, req_id: str | None = None) -> list[int]:
        """The tokens after the latest of the longest copies, if at least prompt_lookup_min long."""
        lengths, longest = self._matches(history, req_id)
        if longest < self.min_n:
            return []
        start = int(np.flatnonzero(lengths == longest)[-1]) + 1
        return history[start : start + self.k].tolist()


class SuffixProposer(_TailProposer):
    """Suffix decoding over the request's own tokens: the most common continuation of
    the longest earlier copy of its tail."""

    def __init__(self, config: SpeculativeConfig) -> None:
        super().__init__(config.num_speculative_tokens, config.suffix_decoding_max_tree_depth)
        self.min_token_prob = config.suffix_decoding_min_token_prob

    def propose(self, history: np.ndarray, req_id: str | None = None) -> list[int]:
        """The majority walk after the longest copies of the tail (see the module's doc)."""
        lengths, longest = self._matches(history, req_id)
        if not longest:
            return []
        follow = np.flatnonzero(lengths == longest) + 1  # where each longest copy continues
        drafted: list[int] = []
        for step in range(self.k):
            follow = follow[follow + step < len(history)]
            if len(follow) == 1:
                # One copy left: the walk copies it (a lone copy always agrees with itself).
                return drafted + history[follow[0] + step : follow[0] + self.k].tolist()
            if not len(follow):
                break
            following = history[follow + step]
            if (following == following[0]).all():
                drafted.append(int(following[0]))  # every copy agrees (np.unique's sort is the cost)
                continue
            tokens, counts = np.unique(following, return_counts=True)
            best = int(np.argmax(counts))
            if counts[best] < self.min_token_prob * len(follow):
                break
            drafted.append(int(tokens[best]))
            follow = follow[following == tokens[best]]
        return drafted


PROPOSERS = {"ngram": NgramProposer, "suffix": SuffixProposer}


def make_proposer(config: SpeculativeConfig) -> Proposer:
    """The proposer `config.method` names (the config check has refused the others)."""
    return PROPOSERS[config.method](config)


def speculates(params: SamplingParams, num_output_tokens: int) -> bool:
    """Whether a request takes proposals: not one whose logits depend on the tokens
    before each position in ways the rejection path does not apply (penalties, logit
    bias, a grammar, stop tokens still masked before min_tokens, a thinking budget's
    forced end marker)."""
    return not (
        params.has_penalties
        or params.logit_bias
        or params.structured_outputs is not None
        or params.thinking_token_budget is not None
        or (num_output_tokens < params.min_tokens and bool(params.all_stop_token_ids))
    )
