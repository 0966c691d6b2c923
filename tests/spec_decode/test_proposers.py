"""The proposers on hand-made histories: ngram continues the latest earlier copy of the
longest tail within [prompt_lookup_min, prompt_lookup_max]; suffix continues the longest
earlier copy of the tail with the continuation most copies share, stopping where fewer
than suffix_decoding_min_token_prob of them agree; neither proposes without a match."""

from __future__ import annotations

import numpy as np

from accord.core.sampling_params import SamplingParams
from accord.core.spec_decode.config import SpeculativeConfig
from accord.core.spec_decode.matching import tail_matches
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
