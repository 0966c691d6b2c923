"""The TEST06-style findings on served completions: the first streamed token against
token 0 of the non-streamed result, EOS only once and only last, and usage equal to
the tokens produced."""

from __future__ import annotations

from accord.gate.server_checks import ServedCompletion, eos_problem, first_token_problem, usage_problem

EOS = 2


def test_matching_first_tokens_are_no_problem() -> None:
    assert first_token_problem(ServedCompletion([5, 6], 2), ServedCompletion([5, 7], 2)) is None


def test_a_different_first_streamed_token_is_a_problem() -> None:
    problem = first_token_problem(ServedCompletion([5, 6], 2), ServedCompletion([9, 6], 2))
    assert problem == "streamed [9] vs non-streamed [5]"


def test_an_empty_response_has_no_first_token_to_agree_on() -> None:
    assert first_token_problem(ServedCompletion([], 0), ServedCompletion([], 0)) is not None


def test_one_terminal_eos_is_no_problem() -> None:
    assert eos_problem(ServedCompletion([5, 6, EOS], 3), {EOS}) is None


def test_an_eos_before_the_end_is_a_problem() -> None:
    assert eos_problem(ServedCompletion([5, EOS, 6], 3), {EOS}) == "EOS at positions [1] of 3"


def test_two_eos_tokens_are_a_problem() -> None:
    assert eos_problem(ServedCompletion([5, EOS, EOS], 3), {EOS}) == "EOS at positions [1, 2] of 3"


def test_usage_counting_a_token_not_produced_is_a_problem() -> None:
    assert usage_problem(ServedCompletion([5, 6], 3)) == "usage says 3, produced 2"


def test_usage_equal_to_the_tokens_produced_is_no_problem() -> None:
    assert usage_problem(ServedCompletion([5, 6], 2)) is None
