"""The greedy comparison's arithmetic and the prompt set's shape: agreement counts
positions, logprobs are compared only where the streams still agree, and the prompt
set holds short prompts, a shared prefix and a prompt that needs chunked prefill."""

from __future__ import annotations

from accord.gate.smoke import Prompt, compare_streams, prompt_set
from accord.core.outputs import CompletionOutput, Logprob

PROMPTS = [Prompt("p", (1, 2, 3))]


def stream(tokens: list[int], logprobs: list[float]) -> CompletionOutput:
    """A finished sample with each token's chosen logprob."""
    entries = [{token: Logprob(value)} for token, value in zip(tokens, logprobs)]
    return CompletionOutput(0, "", tokens, None, entries)


def test_identical_streams_agree_everywhere() -> None:
    same = stream([5, 6, 7], [-0.1, -0.2, -0.3])
    comparison = compare_streams(PROMPTS, [same], [same])
    assert (comparison.agreement, comparison.max_logprob_diff, comparison.first_divergence) == (1.0, 0.0, None)


def test_first_divergence_names_the_prompt_and_position() -> None:
    comparison = compare_streams(PROMPTS, [stream([5, 6, 7], [0, 0, 0])], [stream([5, 9, 7], [0, 0, 0])])
    assert comparison.first_divergence == ("p", 1)
    assert comparison.agreement == 2 / 3


def test_logprobs_are_compared_only_before_the_streams_part() -> None:
    got = stream([5, 6, 7], [-1.00, -1.0, -9.0])
    want = stream([5, 9, 7], [-1.25, -5.0, -1.0])
    assert compare_streams(PROMPTS, [got], [want]).max_logprob_diff == 0.25


def test_a_shorter_stream_counts_its_missing_tokens_as_disagreement() -> None:
    comparison = compare_streams(PROMPTS, [stream([5], [0])], [stream([5, 6], [0, 0])])
    assert comparison.agreement == 0.5
    assert comparison.first_divergence == ("p", 1)


def test_the_prompt_set_has_a_prompt_longer_than_a_steps_token_budget() -> None:
    prompts = prompt_set(list(range(10, 40)), max_num_batched_tokens=32, room=100)
    assert max(len(p.token_ids) for p in prompts) > 32


def test_the_prompt_set_has_two_prompts_sharing_a_long_prefix() -> None:
    a, b = [p.token_ids for p in prompt_set(list(range(10, 40)), 32, room=100) if p.label.startswith("shared")]
    assert a[:-1] == b[:-1] and a != b and len(a) >= 32


def test_every_prompt_fits_the_room_left_for_generation() -> None:
    assert all(len(p.token_ids) <= 40 for p in prompt_set(list(range(10, 40)), 512, room=40))
