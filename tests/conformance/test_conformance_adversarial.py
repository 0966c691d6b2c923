"""The adversarial draws: seeded, within their budget, across size boundaries, the
dtype's range and every padding position; they catch a bug the hand-written cases
cannot reach, and the cpu backend passes them."""

from __future__ import annotations

import torch
from conformance_doubles import broken, linear_without_an_odd_tail

from accord.backends import get_backend
from accord.conformance import ConformanceRunner, Status, cases_for
from accord.conformance.adversarial import DRAWERS, DRAWS_PER_OP, adversarial_cases
from accord.conformance.compare import same_bits


def test_draws_repeat_under_their_seed_and_change_with_it() -> None:
    first, again, other = (list(adversarial_cases("linear", seed)) for seed in (0, 0, 1))
    assert len(first) == DRAWS_PER_OP
    assert all(same_bits(a.args["x"], b.args["x"]) for a, b in zip(first, again))
    assert [c.name for c in first] != [c.name for c in other]


def test_draws_reach_subnormals_zeros_ties_and_sizes_off_powers_of_two() -> None:
    xs = [c.args["x"] for seed in range(3) for c in adversarial_cases("rms_norm", seed)]
    assert any(bool(((x != 0) & (x.abs() < torch.finfo(x.dtype).tiny)).any()) for x in xs), "subnormals"
    assert all(bool((x == 0).any()) for x in xs), "zeros"
    assert all(x.reshape(-1).unique().numel() < x.numel() for x in xs), "exact ties"
    sizes = {x.shape[1] for x in xs}
    assert any(size & (size - 1) for size in sizes), "a size that is not a power of two"


def test_padding_slots_move_through_first_middle_last_and_all() -> None:
    draws = list(adversarial_cases("reshape_and_cache", 0))
    positions = [(c.args["slot_mapping"] == -1).nonzero().flatten().tolist() for c in draws]
    tokens = [c.args["slot_mapping"].numel() for c in draws]
    assert positions[0] == [0] and positions[1] == [tokens[1] // 2] and positions[2] == [tokens[2] - 1]
    assert positions[3] == list(range(tokens[3]))


def test_every_op_with_a_drawer_runs_its_draws_in_the_default_cases() -> None:
    for op in DRAWERS:
        assert sum(c.name.startswith("adversarial") for c in cases_for(op)) == DRAWS_PER_OP


def test_a_linear_losing_an_odd_tail_passes_the_written_cases_and_fails_the_draws() -> None:
    runner = ConformanceRunner(broken("odd tail", "linear", linear_without_an_odd_tail), get_backend("reference"))
    written = [c for c in cases_for("linear") if not c.expect_refusal and not c.name.startswith("adversarial")]
    spared = [runner.run_case(c) for c in written if c.name.startswith(("T=1 ", "T=7 "))]
    assert spared and {r.status for r in spared} == {Status.PASS}
    caught = [runner.run_case(c) for c in adversarial_cases("linear", 0)]
    assert Status.FAIL in {r.status for r in caught}


def test_the_cpu_backend_passes_every_draw() -> None:
    runner = ConformanceRunner(get_backend("cpu"), get_backend("reference"))
    results = [runner.run_case(c) for op in DRAWERS for c in adversarial_cases(op, 0)]
    assert {r.status for r in results} == {Status.PASS}, [r.message for r in results if r.status is not Status.PASS]
