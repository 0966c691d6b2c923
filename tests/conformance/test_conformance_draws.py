"""The draws check's statistics: its chi-square p-value agrees with the textbook
figure, and it tells a fitting histogram from a misfit and an excluded token."""

from __future__ import annotations

import torch

from accord.conformance.draws import SIGNIFICANCE, chi_square, draw_problems


def call(rows: int, top_k: int) -> dict[str, object]:
    logits = torch.tensor([[2.0, 1.0, 0.0, -1.0]]).expand(rows, 4)
    return {
        "logits": logits, "temperature": torch.ones(rows), "top_k": torch.full((rows,), top_k, dtype=torch.int32),
        "top_p": torch.ones(rows), "min_p": torch.zeros(rows),
    }


def test_chi_square_p_value_of_a_known_table() -> None:
    # 3 degrees of freedom, statistic 20: the chi2 survival function gives 1.697e-4.
    statistic, p_value = chi_square(torch.tensor([10.0, 20, 30, 40]), torch.tensor([25.0, 25, 25, 25]))
    assert statistic == 20.0 and abs(p_value - 1.6974e-4) < 1e-7


def test_draws_in_proportion_fit_and_skewed_draws_do_not() -> None:
    args = call(1000, 2)
    first, second = torch.softmax(torch.tensor([2.0, 1.0]), 0).tolist()
    fitting = torch.tensor([0] * round(1000 * first) + [1] * round(1000 * second))
    assert draw_problems(args, {"token_ids": fitting}) == []
    skewed = torch.tensor([0] * 500 + [1] * 500)
    (problem,) = draw_problems(args, {"token_ids": skewed})
    assert "chi-square" in problem and float(problem.split("p = ")[1].split()[0]) < SIGNIFICANCE


def test_a_token_outside_the_filter_is_named() -> None:
    tokens = torch.zeros(10, dtype=torch.int64)
    tokens[3] = 2  # top_k=2 keeps tokens 0 and 1 only
    (problem,) = draw_problems(call(10, 2), {"token_ids": tokens})
    assert "row 3 drew token 2" in problem
