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
from .matching import tail_matches


class Proposer(Protocol):
    """Drafts up to `num_speculative_tokens` tokens after a token history."""

    def propose(self, history: np.ndarray) -> list[int]:
        """The drafted tokens after `history` (1-D token ids), possibly none."""
        ...


class NgramProposer:
    """Prompt lookup: continue the latest earlier copy of the longest matching n-gram."""

    def __init__(self, config: SpeculativeConfig) -> None:
        self.k = config.num_speculative_tokens
        self.min_n, self.max_n = config.prompt_lookup_min, config.prompt_lookup_max

    def propose(self, history: np.ndarray) -> list[int]:
        ends, lengths = tail_matches(history, self.max_n)
        usable = np.flatnonzero(lengths >= self.min_n)
        if not len(usable):
            return []
        # The longest match; among equals the latest (np.argmax takes the first of the reversed).
        best = usable[len(usable) - 1 - int(np.argmax(lengths[usable][::-1]))]
        start = int(ends[best]) + 1
        return history[start : start + self.k].tolist()


class SuffixProposer:
    """Suffix decoding over the request's own tokens: the most common continuation of
    the longest earlier copy of its tail."""

    def __init__(self, config: SpeculativeConfig) -> None:
        self.k = config.num_speculative_tokens
        self.max_depth = config.suffix_decoding_max_tree_depth
        self.min_token_prob = config.suffix_decoding_min_token_prob

    def propose(self, history: np.ndarray) -> list[int]:
        ends, lengths = tail_matches(history, self.max_depth)
        if not len(ends):
            return []
        follow = ends[lengths == lengths.max()] + 1  # where each longest copy continues
        drafted: list[int] = []
        for step in range(self.k):
            follow = follow[follow + step < len(history)]
            if not len(follow):
                break
            tokens, counts = np.unique(history[follow + step], return_counts=True)
            best = int(np.argmax(counts))
            if counts[best] < self.min_token_prob * len(follow):
                break
            drafted.append(int(tokens[best]))
            follow = follow[history[follow + step] == tokens[best]]
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
