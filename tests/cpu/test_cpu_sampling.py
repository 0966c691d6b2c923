"""The cpu sampler draws exactly the reference's tokens (the contract fixes the seeded
draw), returns the same logprobs, and never touches an RNG for greedy rows."""

from __future__ import annotations

import pytest
import torch

from accord.backends.cpu.kernels import _top_p, sampling

VOCAB = 512


def _params(
    temperature: list[float], top_k: list[int], top_p: list[float], min_p: list[float]
) -> tuple[torch.Tensor, ...]:
    rows = len(temperature)
    return (
        torch.tensor(temperature),
        torch.tensor(top_k, dtype=torch.int32),
        torch.tensor(top_p),
        torch.tensor(min_p),
        torch.arange(rows, dtype=torch.int64) * 7919 + 1,
    )


#: One row per filter combination: greedy, plain, top-k, top-p, min-p, all three, and
#: a top-k larger than the vocabulary.
MIXED_ROWS = _params(
    temperature=[0.0, 1.0, 0.7, 1.3, 0.9, 0.8, 1.0],
    top_k=[0, 0, 20, 0, 0, 50, VOCAB + 10],
    top_p=[1.0, 1.0, 1.0, 0.9, 1.0, 0.8, 1.0],
    min_p=[0.0, 0.0, 0.0, 0.0, 0.1, 0.05, 0.0],
)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_draws_the_reference_tokens(assert_matches_reference, dtype) -> None:
    logits = (torch.randn(len(MIXED_ROWS[0]), VOCAB) * 3).to(dtype)
    (tokens, *_), (want_tokens, *_) = assert_matches_reference("sample", logits, *MIXED_ROWS, num_logprobs=5)
    assert torch.equal(tokens, want_tokens)


def test_top_logprobs_name_the_reference_tokens(assert_matches_reference) -> None:
    logits = torch.randn(len(MIXED_ROWS[0]), VOCAB)
    got, want = assert_matches_reference("sample", logits, *MIXED_ROWS, num_logprobs=4)
    assert torch.equal(got[3], want[3])


def test_many_seeded_rows_draw_the_reference_tokens(assert_matches_reference) -> None:
    rows = 64
    params = _params([1.0] * rows, [0] * rows, [0.95] * rows, [0.0] * rows)
    (tokens, *_), (want_tokens, *_) = assert_matches_reference("sample", torch.randn(rows, VOCAB), *params)
    assert torch.equal(tokens, want_tokens)


def test_greedy_rows_never_draw(cpu_ops, monkeypatch) -> None:
    def refuse(*args, **kwargs):
        raise AssertionError("a greedy batch ran the seeded draw")

    monkeypatch.setattr(sampling, "_exponential_race", refuse)
    params = _params([0.0, 1e-6], [0, 5], [1.0, 0.5], [0.0, 0.1])
    logits = torch.randn(2, VOCAB)
    tokens, *_ = cpu_ops.sample(logits, *params)
    assert torch.equal(tokens, logits.argmax(dim=-1))


@pytest.mark.parametrize("sharpness", [0.5, 3.0, 12.0])  # flat, moderate, peaked
def test_top_p_candidates_keep_what_a_full_sort_keeps(sharpness) -> None:
    # bf16 logits make many exact ties, so the stable order of equal p matters.
    logits = (torch.randn(16, VOCAB) * sharpness).to(torch.bfloat16).float()
    probs = torch.softmax(logits, dim=-1)
    top_p = torch.tensor([0.1, 0.5, 0.9, 0.95, 0.99, 0.999999, 0.3, 0.8] * 2)
    assert torch.equal(_top_p.keep_top_p(probs, top_p), _top_p.keep_by_full_sort(probs, top_p))
