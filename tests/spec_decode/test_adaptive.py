"""Adaptive speculation (spec_decode/adaptive.py): the choice of how many drafts each
decode checks maximises expected tokens per second (against a brute force over every
choice), drafts nothing where acceptance is low or a draft costs a decode's share of a
compute-bound step, everything where acceptance is high and checking is cheap; the
measurements measure a plain step, then a probe checking the first draft of every
proposal, before choosing, and again after REFRESH_STEPS; and the scheduler applies the
choice to a step's drafts."""

from __future__ import annotations

import itertools

from hypothesis import given, settings
from hypothesis import strategies as st

from accord.core.spec_decode.adaptive import (
    REFRESH_STEPS,
    AdaptiveDrafting,
    StepCosts,
    acceptance_trials,
    choose_draft_lengths,
)
from test_spec_scheduler import add, land, make_scheduler


def expected_rate(acceptance: list[float], lengths: list[int], costs: StepCosts) -> float:
    """Tokens per second of a step checking `lengths` drafts: each decode emits
    1 + p + ... + p^k tokens (geometric acceptance), the step costs plain + c per draft."""
    tokens = sum(sum(p**j for j in range(k + 1)) for p, k in zip(acceptance, lengths))
    return tokens / (costs.plain_seconds + costs.seconds_per_draft * sum(lengths))


def test_low_acceptance_drafts_nothing() -> None:
    # A draft adds 0.1 tokens and costs 0.3 of a plain step's 1 token: a loss.
    assert choose_draft_lengths([0.1], [4], StepCosts(plain_seconds=1.0, seconds_per_draft=0.3)) == [0]


def test_high_acceptance_with_cheap_checking_drafts_the_whole_proposal() -> None:
    # Draft 4 still adds 0.9^4 = 0.66 tokens for 0.02 of a step.
    assert choose_draft_lengths([0.9], [4], StepCosts(plain_seconds=1.0, seconds_per_draft=0.02)) == [4]


def test_a_draft_costing_a_decode_share_of_a_compute_bound_step_is_never_worth_it() -> None:
    # 32 decodes: a plain step yields one token per 1/32 of its time, a draft at best
    # (p = 0.95) yields 0.95 tokens for the same time.
    costs = StepCosts(plain_seconds=3.2, seconds_per_draft=0.1)
    assert choose_draft_lengths([0.95] * 32, [8] * 32, costs) == [0] * 32


def test_a_middling_acceptance_drafts_while_each_draft_raises_the_rate() -> None:
    # p = 0.5, c = 0.1: draft 1 (0.5 tokens) makes 1.5/1.1 = 1.36 tok/s, draft 2 (0.25)
    # 1.75/1.2 = 1.46, draft 3 (0.125) would make 1.875/1.3 = 1.44: stop at two.
    assert choose_draft_lengths([0.5], [8], StepCosts(plain_seconds=1.0, seconds_per_draft=0.1)) == [2]


def test_no_decode_checks_more_drafts_than_it_proposed() -> None:
    assert choose_draft_lengths([1.0, 1.0], [0, 2], StepCosts(plain_seconds=1.0, seconds_per_draft=0.0)) == [0, 2]


@settings(max_examples=150, deadline=None)
@given(
    st.lists(st.tuples(st.floats(0.0, 1.0), st.integers(0, 3)), min_size=1, max_size=3),
    st.floats(0.01, 2.0),
    st.floats(0.0, 1.0),
)
def test_the_choice_reaches_the_best_rate_of_any_choice(requests, plain, per_draft) -> None:
    acceptance = [p for p, _ in requests]
    proposals = [length for _, length in requests]
    costs = StepCosts(plain, per_draft)
    best = max(expected_rate(acceptance, list(choice), costs)
               for choice in itertools.product(*(range(length + 1) for length in proposals)))
    chosen = choose_draft_lengths(acceptance, proposals, costs)
    assert all(0 <= k <= length for k, length in zip(chosen, proposals))
    assert expected_rate(acceptance, chosen, costs) >= best * (1 - 1e-9)


def test_a_check_tests_the_accepted_drafts_and_the_first_rejected_one() -> None:
    assert acceptance_trials(drafted=4, accepted=4) == 4
    assert acceptance_trials(drafted=4, accepted=1) == 2
    assert acceptance_trials(drafted=4, accepted=0) == 1


def test_acceptance_is_a_decayed_average_of_accepted_over_tested_drafts() -> None:
    adaptive = AdaptiveDrafting()
    assert adaptive.acceptance("r") == 1.0  # nothing measured: check its drafts
    adaptive.observe_check("r", drafted=4, accepted=1)  # 1 of 2 tested
    # Its own 1 of 2, and 2 trials' worth of all requests' 1 of 2.
    assert adaptive.acceptance("r") == 0.5
    adaptive.observe_check("r", drafted=4, accepted=4)
    own = (0.8 * 1 + 4, 0.8 * 2 + 4)  # decayed accepted and tested
    every = (0.98 * 1 + 4, 0.98 * 2 + 4)
    prior = every[0] / every[1]
    assert abs(adaptive.acceptance("r") - (own[0] + 2 * prior) / (own[1] + 2)) < 1e-12
    # A new request starts from all requests' average; a finished one's is dropped.
    assert abs(adaptive.acceptance("new") - prior) < 1e-12
    adaptive.forget("r")
    assert abs(adaptive.acceptance("r") - prior) < 1e-12


def test_a_bucket_fits_a_plain_steps_seconds_and_a_drafts_from_its_steps() -> None:
    adaptive = AdaptiveDrafting()
    # Steps of 1 s + 0.1 s per draft: a draft (p = 1) adds 1 token for 0.1 of 4 tokens' 1 s.
    for drafts in (0, 8, 4, 12):
        adaptive.observe_step(4, drafts, seconds=1.0 + 0.1 * drafts)
    assert adaptive.draft_lengths({"a": 2, "b": 0, "c": 1, "d": 0}) == {"a": 2, "b": 0, "c": 1, "d": 0}
    # The same 0.1 s a draft at 1 s for 32 decodes costs more than a draft returns.
    for drafts in (0, 8, 4, 12):
        adaptive.observe_step(32, drafts, seconds=1.0 + 0.1 * drafts)
    assert adaptive.draft_lengths({f"r{i}": 2 for i in range(32)}) == {f"r{i}": 0 for i in range(32)}


def test_a_bucket_measures_a_plain_step_then_probes_each_proposals_first_draft_before_choosing() -> None:
    adaptive = AdaptiveDrafting()
    proposals = {"a": 3, "b": 2, "c": 0}
    assert adaptive.draft_lengths(proposals) == {"a": 0, "b": 0, "c": 0}
    adaptive.observe_step(3, 0, seconds=1.0)
    assert adaptive.draft_lengths(proposals) == {"a": 1, "b": 1, "c": 0}
    adaptive.observe_step(3, 2, seconds=3.0)  # 1 s per draft: three times a decode's share
    assert adaptive.draft_lengths(proposals) == {"a": 0, "b": 0, "c": 0}
    # Another batch size is measured on its own.
    assert adaptive.draft_lengths({"a": 3}) == {"a": 0}
    adaptive.observe_step(1, 0, seconds=1.0)
    assert adaptive.draft_lengths({"a": 3}) == {"a": 1}


def test_a_plain_step_is_measured_again_after_refresh_steps_of_drafting() -> None:
    adaptive = AdaptiveDrafting()
    adaptive.observe_step(1, 0, seconds=1.0)
    for _ in range(REFRESH_STEPS):
        adaptive.observe_step(1, 4, seconds=1.04)  # cheap drafts, all accepted
        adaptive.observe_check("a", drafted=4, accepted=4)
    assert adaptive.draft_lengths({"a": 4}) == {"a": 0}
    adaptive.observe_step(1, 0, seconds=1.0)
    assert adaptive.draft_lengths({"a": 4}) == {"a": 4}


def test_proposals_are_probed_again_after_refresh_plain_steps() -> None:
    adaptive = AdaptiveDrafting()
    adaptive.observe_step(1, 0, seconds=1.0)
    adaptive.observe_step(1, 4, seconds=9.0)  # 2 s a draft: none pays
    for _ in range(REFRESH_STEPS):
        assert adaptive.draft_lengths({"a": 4}) == {"a": 0}
        adaptive.observe_step(1, 0, seconds=1.0)
    assert adaptive.draft_lengths({"a": 4}) == {"a": 1}


def test_only_requests_whose_first_draft_pays_alone_are_proposed_for() -> None:
    adaptive = AdaptiveDrafting()
    assert adaptive.worth_proposing(["a", "b"]) == {"a", "b"}  # nothing measured yet
    adaptive.observe_step(2, 0, seconds=1.0)
    adaptive.observe_step(2, 10, seconds=2.0)  # 0.1 s a draft: pays at p > 2 x 0.1 / 1
    adaptive.observe_check("a", drafted=4, accepted=4)
    for _ in range(5):
        adaptive.observe_check("b", drafted=4, accepted=0)
    assert adaptive.acceptance("a") > 0.2 > adaptive.acceptance("b")
    assert adaptive.worth_proposing(["a", "b"]) == {"a"}
    # The step before the next probe, everyone is proposed for.
    for _ in range(REFRESH_STEPS - 2):
        adaptive.observe_step(2, 0, seconds=1.0)
    assert adaptive.worth_proposing(["a", "b"]) == {"a"}
    adaptive.observe_step(2, 0, seconds=1.0)
    assert adaptive.worth_proposing(["a", "b"]) == {"a", "b"}


def adaptive_decoding(seconds_of_check: float, emitted: list[int]):
    """An adaptive scheduler whose request "r" decodes with drafts [6, 7, 8]: one plain
    step of 1 s, then the probe checking the first that took `seconds_of_check` and
    emitted `emitted`; returns the scheduler and its next step."""
    scheduler = make_scheduler(adaptive_num_speculative_tokens=True)
    add(scheduler, "r", [1, 2, 3, 4, 5])
    land(scheduler, scheduler.schedule(), {"r": [100]}, {"r": [6, 7, 8]})  # the prompt: not timed
    plain = scheduler.schedule()
    assert plain.num_scheduled_tokens == {"r": 1} and plain.scheduled_spec_decode_tokens == {}
    land(scheduler, plain, {"r": [5]}, {"r": [6, 7, 8]}, step_seconds=1.0)
    check = scheduler.schedule()
    assert check.scheduled_spec_decode_tokens == {"r": [6]}
    land(scheduler, check, {"r": emitted}, {"r": [6, 7, 8]}, step_seconds=seconds_of_check)
    return scheduler, scheduler.schedule()


def test_the_scheduler_checks_no_drafts_once_they_cost_more_than_they_return() -> None:
    _, step = adaptive_decoding(seconds_of_check=1.5, emitted=[9])  # 0.5 s a draft, none accepted
    assert step.scheduled_spec_decode_tokens == {} and step.num_scheduled_tokens == {"r": 1}


def test_the_scheduler_checks_every_draft_while_they_pay() -> None:
    _, step = adaptive_decoding(seconds_of_check=1.01, emitted=[6, 7])  # 0.01 s a draft, accepted
    assert step.scheduled_spec_decode_tokens == {"r": [6, 7, 8]} and step.num_scheduled_tokens == {"r": 4}
