"""sample: greedy rows, the seeded exponential-race draw, the filters and logprobs."""

from __future__ import annotations

import math

import pytest
import torch

DRAWS = 2000
#: chi-square bound for 3 degrees of freedom at p ~ 1e-6: a wrong sampler blows
#: far past it with DRAWS draws, a right one essentially never reaches it.
CHI2_BOUND = 30.0


def _params(batch: int, temperature=1.0, top_k=0, top_p=1.0, min_p=0.0, seeds=None) -> dict[str, torch.Tensor]:
    """Per-row sampling tensors, the same settings on every row."""
    return {
        "temperature": torch.full((batch,), temperature),
        "top_k": torch.full((batch,), top_k, dtype=torch.int32),
        "top_p": torch.full((batch,), top_p),
        "min_p": torch.full((batch,), min_p),
        "seeds": torch.arange(batch) if seeds is None else seeds,
    }


def _draw_many(ops, probs: list[float], **settings) -> torch.Tensor:
    """Counts per token of DRAWS seeded draws from logits log(probs)."""
    logits = torch.tensor(probs).log().expand(DRAWS, -1).contiguous()
    tokens, *_ = ops.sample(logits, **_params(DRAWS, **settings))
    return torch.bincount(tokens, minlength=len(probs)).double()


def _chi2(counts: torch.Tensor, probs: torch.Tensor) -> float:
    expected = counts.sum() * probs
    kept = expected > 0
    return float(((counts[kept] - expected[kept]) ** 2 / expected[kept]).sum())


def test_greedy_rows_take_the_argmax(ops) -> None:
    logits = torch.randn(5, 50)
    tokens, *_ = ops.sample(logits, **_params(5, temperature=0.0))
    assert torch.equal(tokens, logits.argmax(dim=1))


def test_greedy_takes_the_first_index_among_tied_maxima(ops) -> None:
    logits = torch.tensor([[0.0, 3.0, 1.0, 3.0, 3.0]])
    tokens, *_ = ops.sample(logits, **_params(1, temperature=0.0))
    assert tokens.tolist() == [1]


def test_top_k_of_one_samples_the_greedy_token(ops) -> None:
    logits = torch.randn(8, 30)
    tokens, *_ = ops.sample(logits, **_params(8, top_k=1))
    assert torch.equal(tokens, logits.argmax(dim=1))


def test_the_draw_is_the_contracts_seeded_exponential_race(ops) -> None:
    logits, seeds = torch.randn(4, 40), torch.tensor([0, 17, 123456789, 2**40])
    tokens, *_ = ops.sample(logits, **_params(4, temperature=0.7, seeds=seeds))
    for row, seed, token in zip(logits, seeds.tolist(), tokens.tolist()):
        uniform = torch.rand(40, generator=torch.Generator("cpu").manual_seed(seed))
        assert token == int(torch.argmax((row / 0.7).softmax(0) / -uniform.log()))


def test_a_rows_token_depends_on_its_seed_not_on_its_batch_mates(ops) -> None:
    row = torch.randn(1, 64)
    alone, *_ = ops.sample(row, **_params(1, seeds=torch.tensor([42])))
    batch = torch.cat([torch.randn(2, 64), row, torch.randn(3, 64)])
    together, *_ = ops.sample(batch, **_params(6, seeds=torch.tensor([1, 2, 42, 3, 4, 5])))
    assert together[2] == alone[0]


@pytest.mark.parametrize("temperature", [1.0, 0.5])
def test_seeded_draws_follow_the_tempered_softmax(ops, temperature) -> None:
    probs = torch.tensor([0.1, 0.2, 0.3, 0.4], dtype=torch.float64)
    counts = _draw_many(ops, probs.tolist(), temperature=temperature)
    tempered = (probs.log() / temperature).softmax(0)
    assert _chi2(counts, tempered) < CHI2_BOUND


def test_top_k_draws_only_the_k_most_likely_tokens_in_proportion(ops) -> None:
    counts = _draw_many(ops, [0.1, 0.4, 0.2, 0.3], top_k=2)
    assert counts[[0, 2]].sum() == 0
    assert _chi2(counts, torch.tensor([0, 4 / 7, 0, 3 / 7], dtype=torch.float64)) < CHI2_BOUND


def test_top_p_keeps_tokens_whose_preceding_cumulative_probability_is_below_p(ops) -> None:
    # Preceding cumulative in descending order: 0, 0.5, 0.8, 0.95; top_p 0.7 keeps two.
    counts = _draw_many(ops, [0.05, 0.5, 0.15, 0.3], top_p=0.7)
    assert counts[[0, 2]].sum() == 0
    assert _chi2(counts, torch.tensor([0, 5 / 8, 0, 3 / 8], dtype=torch.float64)) < CHI2_BOUND


def test_top_p_drops_a_token_whose_preceding_cumulative_probability_equals_p(ops) -> None:
    # Four equal logits give p = 0.25 exactly: preceding sums 0, .25, .5, .75.
    tokens, *_ = ops.sample(torch.zeros(200, 4), **_params(200, top_p=0.5))
    assert len(set(tokens.tolist())) == 2


def test_min_p_drops_tokens_below_min_p_times_the_largest(ops) -> None:
    counts = _draw_many(ops, [0.05, 0.5, 0.15, 0.3], min_p=0.2)  # keeps p >= 0.1
    assert counts[0] == 0
    assert _chi2(counts, torch.tensor([0, 0.5, 0.15, 0.3], dtype=torch.float64) / 0.95) < CHI2_BOUND


def test_min_p_keeps_tokens_exactly_at_the_threshold(ops) -> None:
    tokens, *_ = ops.sample(torch.zeros(200, 4), **_params(200, min_p=1.0))
    assert set(tokens.tolist()) == {0, 1, 2, 3}


def test_logprob_is_of_the_raw_logits_whatever_the_temperature_and_filters(ops) -> None:
    logits = torch.randn(6, 20)
    tokens, logprobs, *_ = ops.sample(logits, **_params(6, temperature=0.3, top_k=5, top_p=0.9))
    raw = logits.double().log_softmax(dim=1)
    torch.testing.assert_close(logprobs.double(), raw.gather(1, tokens[:, None])[:, 0])


def test_top_logprobs_are_the_rows_best_raw_logprobs_in_descending_order(ops) -> None:
    logits = torch.randn(3, 20)
    _, _, top_logprobs, top_token_ids = ops.sample(logits, **_params(3), num_logprobs=4)
    descending, order = logits.double().log_softmax(dim=1).sort(dim=1, descending=True)
    torch.testing.assert_close(top_logprobs.double(), descending[:, :4])
    assert torch.equal(top_token_ids, order[:, :4])


def test_no_logprobs_requested_gives_empty_top_tensors(ops) -> None:
    _, _, top_logprobs, top_token_ids = ops.sample(torch.randn(2, 10), **_params(2))
    assert top_logprobs.shape == (2, 0) and top_token_ids.shape == (2, 0)


def test_tokens_with_minus_infinite_logits_are_never_drawn(ops) -> None:
    logits = torch.tensor([-math.inf, 0.0, -math.inf, 1.0]).expand(200, -1).contiguous()
    tokens, logprobs, *_ = ops.sample(logits, **_params(200))
    assert set(tokens.tolist()) <= {1, 3}
    assert torch.isfinite(logprobs).all()
