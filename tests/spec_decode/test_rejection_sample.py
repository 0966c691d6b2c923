"""The rejection_sample op on the reference and cpu kernels: greedy rows keep the drafts
that equal the argmax chain (computed here, independently) and emit the argmax after
them; the edges (all, none accepted, k = 1, rows without drafts, a draft the draft
distribution gives 0); and the lossless property as a statistical check whose own
power is shown on a sampler that gets the recovered token wrong."""

from __future__ import annotations

import pytest
import torch

from accord.backends.registry import get_backend
from accord.conformance.draws import rejection_draw_problems
from accord.op_contracts import OpDispatcher

V, K = 12, 3


@pytest.fixture(params=["reference", "cpu"])
def ops(request) -> OpDispatcher:
    return OpDispatcher(get_backend(request.param), strict=True)


def call(ops, logits, drafts, num, temperature, uniforms=None, race=None, draft_probs=None, top_k=None, top_p=None):
    batch = logits.shape[0]
    g = torch.Generator().manual_seed(1)
    return ops.rejection_sample(
        logits, drafts, torch.tensor(num, dtype=torch.int32), draft_probs, torch.tensor(temperature),
        torch.zeros(batch, dtype=torch.int32) if top_k is None else top_k,
        torch.ones(batch) if top_p is None else top_p, torch.zeros(batch),
        torch.rand(batch, drafts.shape[1], generator=g) if uniforms is None else uniforms,
        torch.rand(batch, V, generator=g) if race is None else race,
    )


def test_greedy_rows_keep_the_drafts_of_the_argmax_chain(ops) -> None:
    g = torch.Generator().manual_seed(0)
    logits = torch.randn(4, K + 1, V, generator=g)
    chain = [[int(logits[b, j].argmax()) for j in range(K + 1)] for b in range(4)]
    drafts = torch.tensor([c[:K] for c in chain])
    drafts[1, 2] = (chain[1][2] + 1) % V  # row 1 keeps 2
    drafts[2, 0] = (chain[2][0] + 1) % V  # row 2 keeps none
    out, accepted = call(ops, logits, drafts, [K, K, K, 1], [0.0] * 4)
    assert accepted.tolist() == [3, 2, 0, 1]
    assert out[0].tolist() == chain[0]  # every draft, then the bonus argmax
    assert out[1].tolist() == chain[1][:3] + [-1]
    assert out[2].tolist() == [chain[2][0], -1, -1, -1]
    assert out[3].tolist() == chain[3][:2] + [-1, -1]  # k = 1: its draft and the bonus


def test_a_row_without_drafts_emits_one_token(ops) -> None:
    logits = torch.randn(1, K + 1, V, generator=torch.Generator().manual_seed(2))
    out, accepted = call(ops, logits, torch.zeros(1, K, dtype=torch.int64), [0], [0.0])
    assert accepted.tolist() == [0] and out[0].tolist() == [int(logits[0, 0].argmax()), -1, -1, -1]


def test_a_draft_the_target_excludes_is_rejected_and_never_emitted(ops) -> None:
    logits = torch.zeros(1, 2, V)
    logits[0, :, 5] = 4.0
    top_k = torch.tensor([3], dtype=torch.int32)  # token 11 (logit 0, last index) is outside the top 3
    logits[0, :, :3] = 2.0
    drafts = torch.tensor([[11]])
    for seed in range(20):
        g = torch.Generator().manual_seed(seed)
        out, accepted = call(ops, logits, drafts, [1], [1.0], torch.rand(1, 1, generator=g), torch.rand(1, V, generator=g),
                             top_k=top_k)
        assert accepted.tolist() == [0] and int(out[0, 0]) in (0, 1, 2, 5)


def test_a_draft_its_draft_distribution_gives_zero_is_accepted_where_the_target_allows_it(ops) -> None:
    logits = torch.randn(1, 2, V, generator=torch.Generator().manual_seed(3))
    draft_probs = torch.zeros(1, 1, V)
    draft_probs[0, 0, 0] = 1.0  # the draft says token 4 is impossible, yet drafted it
    out, accepted = call(ops, logits, torch.tensor([[4]]), [1], [1.0], uniforms=torch.tensor([[0.999]]),
                         draft_probs=draft_probs)
    assert accepted.tolist() == [1] and int(out[0, 0]) == 4


def lossless_case(draws: int = 4000):
    """One target row repeated with distinct uniforms, a point-mass draft on a token of
    middling probability at position 0 and the most likely token at position 1."""
    g = torch.Generator().manual_seed(4)
    logits = torch.randn(1, 3, V, generator=g).expand(draws, 3, V).contiguous()
    drafts = torch.stack([logits[0, 0].argsort()[V // 2], logits[0, 1].argmax()]).expand(draws, 2).contiguous()
    args = {
        "target_logits": logits, "draft_token_ids": drafts,
        "num_draft_tokens": torch.full((draws,), 2, dtype=torch.int32), "draft_probs": None,
        "temperature": torch.full((draws,), 0.8), "top_k": torch.zeros(draws, dtype=torch.int32),
        "top_p": torch.full((draws,), 0.9), "min_p": torch.zeros(draws),
        "uniforms": torch.rand(draws, 2, generator=g), "race_uniforms": torch.rand(draws, V, generator=g),
    }
    return args


def test_emitted_tokens_are_distributed_as_the_targets_whatever_the_draft(ops) -> None:
    # The check fails a correct sampler with probability below 2e-6 (two chi-square
    # tests at SIGNIFICANCE 1e-6); its data are fixed by the seeds above.
    args = lossless_case()
    out, accepted = ops.rejection_sample(**args)
    assert 0 < int((accepted >= 1).sum()) < len(accepted)  # both branches ran
    assert rejection_draw_problems(args, {"output_token_ids": out, "num_accepted": accepted}) == []


def test_the_statistical_check_catches_a_recovery_drawn_from_the_target_instead_of_the_residual() -> None:
    ops = OpDispatcher(get_backend("reference"), strict=True)
    args = lossless_case()
    out, accepted = ops.rejection_sample(**args)
    # The classic mistake: on rejection, draw from p itself (the draft's token included).
    wrong = out.clone()
    from accord.backends.reference.kernels.sampling import filtered_distribution
    p0 = filtered_distribution(args["target_logits"][:, 0], args["temperature"], args["top_k"], args["top_p"],
                               args["min_p"])
    race = torch.where(p0 > 0, p0 / -torch.log(args["race_uniforms"]), torch.full_like(p0, -1.0)).argmax(-1)
    rejected = accepted == 0
    wrong[rejected, 0] = race[rejected]
    problems = rejection_draw_problems(args, {"output_token_ids": wrong, "num_accepted": accepted})
    assert problems and "first tokens do not fit" in problems[0]
