"""The proposers on hand-made histories: ngram continues the latest earlier copy of the
longest tail within [prompt_lookup_min, prompt_lookup_max]; suffix continues the longest
earlier copy of the tail with the continuation most copies share, stopping where fewer
than suffix_decoding_min_token_prob of them agree; neither proposes without a match; and both, kept per request and fed a growing history,
propose exactly what a scan of the whole history from scratch does."""

from __future__ import annotations

from collections import Counter

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from accord.core.sampling_params import SamplingParams
from accord.core.spec_decode.config import SpeculativeConfig
from accord.core.spec_decode.matching import TailMatchIndex, tail_matches
from accord.core.spec_decode.proposers import NgramProposer, SuffixProposer, speculates


def ngram(k: int = 3, low: int = 1, high: int = 4) -> NgramProposer:
    return NgramProposer(SpeculativeConfig.parse(
        {"method": "ngram", "num_speculative_tokens": k, "prompt_lookup_min": low, "prompt_lookup_max": high}))


def suffix(k: int = 4, **keys: object) -> SuffixProposer:
    return SuffixProposer(SpeculativeConfig.parse({"method": "suffix", "num_speculative_tokens": k, **keys}))


def test_tail_matches_counts_each_earlier_copy_of_the_tail() -> None:
    history = np.array([5, 1, 2, 9, 2, 7, 1, 2])
    ends, lengths = tail_matches(history, 4)
    # Token 2 sits at 2 (after 1: a copy of "1 2") and at 4 (after 9: only "2").
    assert ends.tolist() == [2, 4] and lengths.tolist() == [2, 1]


def test_ngram_prefers_the_longest_match_over_a_later_shorter_one() -> None:
    history = np.array([1, 2, 3, 10, 11, 12, 9, 3, 20, 21, 1, 2, 3])
    # "1 2 3" occurs at 0..2 (followed by 10 11 12); "3" alone also at 7 (followed by 20).
    assert ngram().propose(history) == [10, 11, 12]


def test_ngram_takes_the_latest_of_equally_long_matches() -> None:
    history = np.array([4, 5, 6, 7, 4, 5, 8, 9, 4, 5])
    assert ngram(k=2).propose(history) == [8, 9]


def test_ngram_needs_prompt_lookup_min_tokens_of_match() -> None:
    history = np.array([1, 2, 3, 7, 8, 3])
    assert ngram(low=2).propose(history) == []
    assert ngram(low=1).propose(history) == [7, 8, 3]


def test_ngram_match_length_stops_at_prompt_lookup_max() -> None:
    # With at most 2 tokens matched, the copies ending at 2 and 6 tie, and the later wins.
    history = np.array([1, 2, 3, 50, 9, 2, 3, 60, 1, 2, 3])
    assert ngram(k=1, high=2).propose(history) == [60]
    assert ngram(k=1, high=3).propose(history) == [50]


def test_no_proposal_without_an_earlier_copy() -> None:
    history = np.array([1, 2, 3, 4])
    assert ngram().propose(history) == [] and suffix().propose(history) == []
    assert ngram().propose(np.array([7])) == [] and suffix().propose(np.array([7])) == []


def test_suffix_follows_the_continuation_most_copies_share() -> None:
    # "a b" is followed by c d (twice) and by e once: the walk goes c, d.
    a, b, c, d, e = 1, 2, 3, 4, 5
    history = np.array([a, b, c, d, 9, a, b, e, 8, a, b, c, d, 7, a, b])
    assert suffix(k=2).propose(history) == [c, d]


def test_suffix_stops_where_too_few_copies_agree() -> None:
    a, b = 1, 2
    # After "a b": 3 then 4 / 5 / 6 / 7 -- each of the four second tokens has 1/4 of the copies.
    history = np.array([a, b, 3, 4, a, b, 3, 5, a, b, 3, 6, a, b, 3, 7, a, b])
    assert suffix(k=3, suffix_decoding_min_token_prob=0.3).propose(history) == [3]
    assert len(suffix(k=3, suffix_decoding_min_token_prob=0.2).propose(history)) == 3


def test_requests_whose_logits_depend_on_earlier_tokens_take_no_drafts() -> None:
    assert speculates(SamplingParams(), 0)
    assert not speculates(SamplingParams(repetition_penalty=1.2), 0)
    assert not speculates(SamplingParams(logit_bias={3: 1.0}), 0)
    early = SamplingParams(min_tokens=4, stop_token_ids=[2]).for_child(0, set())
    assert not speculates(early, 3) and speculates(early, 4)


def reference_match_lengths(history: list[int], max_len: int) -> list[int]:
    """For each position before the last: how many tokens ending there match the tail
    (at most max_len), by walking back token by token."""
    last = len(history) - 1
    lengths = []
    for end in range(max(last, 0)):
        n = 0
        while n < max_len and end - n >= 0 and history[end - n] == history[last - n]:
            n += 1
        lengths.append(n)
    return lengths


def reference_ngram(history: list[int], k: int, low: int, high: int) -> list[int]:
    """Prompt lookup from scratch: after the latest of the longest (<= high) copies of the tail."""
    lengths = reference_match_lengths(history, high)
    if not lengths or max(lengths) < low:
        return []
    start = max(e for e, n in enumerate(lengths) if n == max(lengths)) + 1
    return history[start : start + k]


def reference_suffix(history: list[int], k: int, depth: int, min_prob: float) -> list[int]:
    """Suffix decoding from scratch: the majority walk after the longest copies of the tail
    (ties to the smaller token id)."""
    lengths = reference_match_lengths(history, depth)
    if not lengths or max(lengths) == 0:
        return []
    follow = [e + 1 for e, n in enumerate(lengths) if n == max(lengths)]
    drafted: list[int] = []
    for step in range(k):
        follow = [f for f in follow if f + step < len(history)]
        if not follow:
            break
        counts = Counter(history[f + step] for f in follow)
        token = min(counts, key=lambda t: (-counts[t], t))
        if counts[token] < min_prob * len(follow):
            break
        drafted.append(token)
        follow = [f for f in follow if history[f + step] == token]
    return drafted


growing_histories = st.tuples(
    st.lists(st.integers(0, 3), min_size=1, max_size=120),  # a small vocabulary: many copies
    # Tokens each step adds: a few (an update per token) or many (a rescan).
    st.lists(st.one_of(st.integers(1, 4), st.integers(5, 30)), min_size=1, max_size=12),
)


@settings(max_examples=60, deadline=None)
@given(growing_histories, st.integers(1, 10), st.sampled_from([0.0, 0.3, 0.6]))
def test_suffix_kept_per_request_proposes_what_a_scan_from_scratch_does(grown, depth, min_prob) -> None:
    tokens, steps = grown
    proposer = suffix(k=5, suffix_decoding_max_tree_depth=depth, suffix_decoding_min_token_prob=min_prob)
    end = 0
    for added in steps:
        end = min(len(tokens), end + added)
        history = np.array(tokens[:end])
        assert proposer.propose(history, "r") == reference_suffix(tokens[:end], 5, depth, min_prob)


@settings(max_examples=60, deadline=None)
@given(growing_histories, st.integers(1, 3), st.integers(0, 3))
def test_ngram_kept_per_request_proposes_what_a_scan_from_scratch_does(grown, low, extra) -> None:
    tokens, steps = grown
    proposer = ngram(k=3, low=low, high=low + extra)
    end = 0
    for added in steps:
        end = min(len(tokens), end + added)
        assert proposer.propose(np.array(tokens[:end]), "r") == reference_ngram(tokens[:end], 3, low, low + extra)


def test_tail_match_index_keeps_the_lengths_a_walk_back_finds() -> None:
    rng = np.random.default_rng(0)
    tokens = rng.integers(0, 3, 200)
    index = TailMatchIndex(5)
    for end in range(1, len(tokens) + 1):
        assert index.update(tokens[:end]).tolist() == reference_match_lengths(tokens[:end].tolist(), 5)


def test_a_forgotten_request_starts_from_its_new_history() -> None:
    proposer = suffix(k=2)
    assert proposer.propose(np.array([1, 2, 3, 1, 2]), "r") == [3, 1]
    proposer.forget("r")
    # The same id with another history (its index dropped) proposes from that history alone.
    assert proposer.propose(np.array([7, 8, 9, 7]), "r") == [8, 9]
