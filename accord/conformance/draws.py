"""The samplers' draws judged as draws: across a case's rows, the tokens drawn must
fit the reference's filtered distribution (Pearson's chi-square), and no row may draw
a token its filters exclude (for the rejection sampler: the target's, whatever the draft). The exact-draw comparison already pins each token; this
check says what is wrong when a filter boundary or the temperature's place is."""

from __future__ import annotations

from typing import Any, Callable, Mapping

import torch

from ..backends.reference.kernels.sampling import filtered_distribution

#: A case fails when its draws are this unlikely under the reference's distribution:
#: small enough that a correct sampler practically never fails (the draws are fixed
#: by the seeds, so a failure would repeat on every run of the case).
SIGNIFICANCE = 1e-6
#: Tokens expected fewer times than this are pooled into one bin (Pearson's
#: approximation needs about five expected draws per bin).
MIN_EXPECTED = 5.0


def draw_problems(args: Mapping[str, Any], outputs: Mapping[str, torch.Tensor]) -> list[str]:
    """Why the drawn token ids do not fit the filtered distribution of the call's
    rows: a token outside a row's filters, or a chi-square p-value below SIGNIFICANCE
    for the pooled histogram (tested where there are at least two bins)."""
    probs = filtered_distribution(args["logits"], args["temperature"], args["top_k"], args["top_p"], args["min_p"])
    return fit_problems(probs, outputs["token_ids"].long(), "draws")


def rejection_draw_problems(args: Mapping[str, Any], outputs: Mapping[str, torch.Tensor]) -> list[str]:
    """The lossless property of a rejection sampler, judged as draws: whatever the
    drafts, each row's first emitted token fits the target's filtered distribution at
    position 0, and among the rows that accepted their first draft, the next token fits
    position 1's (the rows the first draft's acceptance selects are chosen by position
    0 alone, so position 1's draws are still the target's there)."""
    logits = args["target_logits"]
    settings = [args[name] for name in ("temperature", "top_k", "top_p", "min_p")]
    tokens, accepted = outputs["output_token_ids"].long(), outputs["num_accepted"]
    problems = fit_problems(filtered_distribution(logits[:, 0], *settings), tokens[:, 0], "first tokens")
    rows = (accepted >= 1).nonzero().squeeze(1)
    if logits.shape[1] > 1 and rows.numel():
        second = filtered_distribution(logits[rows, 1], *(s[rows] for s in settings))
        problems += fit_problems(second, tokens[rows, 1], "tokens after an accepted first draft")
    return problems


def fit_problems(probs: torch.Tensor, tokens: torch.Tensor, what: str) -> list[str]:
    """Why `tokens` (one per row) do not fit the rows' distributions `probs` [B, V]: a
    token with probability 0, or a chi-square p-value below SIGNIFICANCE for the pooled
    histogram (tested where there are at least two bins)."""
    drawn = probs.gather(1, tokens[:, None]).squeeze(1)
    if bool((excluded := drawn <= 0).any()):
        row = int(excluded.nonzero()[0])
        return [f"row {row} drew token {int(tokens[row])}, which its filters exclude "
                f"({int(excluded.sum())} of {len(tokens)} rows drew an excluded token)"]
    expected = probs.double().sum(0)
    observed = torch.bincount(tokens, minlength=probs.shape[1]).double()
    common = expected >= MIN_EXPECTED
    bins_expected = torch.cat([expected[common], expected[~common].sum().view(1)])
    bins_observed = torch.cat([observed[common], observed[~common].sum().view(1)])
    if bins_expected[-1] < MIN_EXPECTED:  # too little pooled mass for a bin of its own
        bins_expected, bins_observed = bins_expected[:-1], bins_observed[:-1]
    if len(bins_expected) < 2:
        return []
    # Renormalise to the observed total: the rare tokens left out of the bins above.
    bins_expected = bins_expected * bins_observed.sum() / bins_expected.sum()
    statistic, p_value = chi_square(bins_observed, bins_expected)
    if p_value < SIGNIFICANCE:
        return [f"{what} do not fit the filtered distribution: chi-square {statistic:.1f} over "
                f"{len(bins_expected)} bins, p = {p_value:.2g} < {SIGNIFICANCE:g}"]
    return []


def chi_square(observed: torch.Tensor, expected: torch.Tensor) -> tuple[float, float]:
    """Pearson's statistic and its p-value with len - 1 degrees of freedom: the chi2
    survival function is the regularised upper incomplete gamma Q(df / 2, x / 2)."""
    statistic = ((observed - expected) ** 2 / expected).sum()
    freedom = torch.tensor(len(observed) - 1, dtype=torch.float64)
    return float(statistic), float(torch.special.gammaincc(freedom / 2, statistic / 2))


#: The statistical checks of ops whose outputs are draws, by op: each returns the
#: problems it found in a run's outputs for the call's arguments.
STATISTICAL_CHECKS: dict[str, Callable[[Mapping[str, Any], Mapping[str, torch.Tensor]], list[str]]] = {
    "sample": draw_problems,
    "rejection_sample": rejection_draw_problems,
}
