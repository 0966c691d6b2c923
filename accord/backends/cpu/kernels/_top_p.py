"""The top-p (nucleus) filter's keep mask without sorting whole vocabularies.

The contract keeps, in descending p order (ties by token id, a stable sort), each token
whose preceding cumulative p is below top_p. Sorting every row of a [128, 8192] batch
costs far more than the rest of sampling, yet the kept tokens are always a prefix of
the few largest. So each row sorts only its candidates, the tokens above a threshold
whose mass already exceeds top_p: they are exactly the first entries of the full
stable sort, in the same order, so their cumulative sums are bit-identical. A row
whose candidates cannot settle the answer (a flat distribution, top_p near 1) falls
back to the full sort.
"""

from __future__ import annotations

import torch

#: Candidate thresholds tried, as fractions of the row's largest p (largest first:
#: the fewer candidates, the cheaper their sort).
THRESHOLD_RATIOS = (2.0**-8, 2.0**-16)
#: Above this share of the vocabulary, sorting candidates costs more than a full sort.
MAX_CANDIDATE_SHARE = 1 / 8
#: How far the candidates' cumulative mass must exceed top_p for the rest of the
#: vocabulary to be surely dropped: a later token's preceding mass (cumsum - p) can
#: round up to one ulp of 2 (2.4e-7) below the candidates' total, so 4 ulps suffice.
MASS_MARGIN = 2.0**-20


def keep_by_full_sort(probs: torch.Tensor, top_p: torch.Tensor) -> torch.Tensor:
    """The contract's definition, one stable sort per row: [n, V] keep mask."""
    ordered, order = probs.sort(dim=-1, descending=True, stable=True)
    preceding = ordered.cumsum(dim=-1) - ordered
    return torch.empty_like(probs, dtype=torch.bool).scatter_(1, order, preceding < top_p[:, None])


def keep_top_p(probs: torch.Tensor, top_p: torch.Tensor) -> torch.Tensor:
    """The same mask as `keep_by_full_sort`, sorting only each row's candidates."""
    largest = probs.amax(dim=-1, keepdim=True)
    threshold = torch.full_like(largest, -1.0)  # -1: no threshold settles this row
    max_candidates = probs.shape[1] * MAX_CANDIDATE_SHARE
    for ratio in reversed(THRESHOLD_RATIOS):  # the last match (largest ratio) wins
        candidate = largest * ratio
        above = probs > candidate
        mass = probs.masked_fill(~above, 0.0).sum(dim=-1, keepdim=True)
        settles = (mass >= top_p[:, None] + MASS_MARGIN) & (above.count_nonzero(dim=-1)[:, None] <= max_candidates)
        threshold = torch.where(settles, candidate, threshold)
    settled = (threshold[:, 0] >= 0).nonzero().squeeze(1)
    if settled.numel() == 0:
        return keep_by_full_sort(probs, top_p)
    keep = torch.zeros_like(probs, dtype=torch.bool)
    undecided = _keep_among_candidates(probs, top_p, threshold, settled, keep)
    unsettled = torch.cat([(threshold[:, 0] < 0).nonzero().squeeze(1), undecided])
    if unsettled.numel():
        keep[unsettled] = keep_by_full_sort(probs[unsettled], top_p[unsettled])
    return keep


def _keep_among_candidates(
    probs: torch.Tensor, top_p: torch.Tensor, threshold: torch.Tensor, rows: torch.Tensor, keep: torch.Tensor
) -> torch.Tensor:
    """Fill `keep` for `rows` by sorting only their tokens above `threshold`; return
    the rows whose candidates' exact cumulative mass falls short (undecided). The
    pre-check that chose the thresholds summed in another order, so it only guesses."""
    candidates = probs[rows] > threshold[rows]
    counts = candidates.count_nonzero(dim=-1)
    row, column = candidates.nonzero(as_tuple=True)  # row-major: columns ascend per row
    rank = torch.arange(row.numel()) - (counts.cumsum(0) - counts)[row]  # place within its row
    width = int(counts.max())
    # Compact each row's candidates in token order; -1 pads sort after every p >= 0.
    values = torch.full((rows.numel(), width), -1.0, dtype=probs.dtype)
    token = torch.zeros((rows.numel(), width), dtype=torch.long)
    values[row, rank] = probs[rows[row], column]
    token[row, rank] = column
    ordered, order = values.sort(dim=-1, descending=True, stable=True)
    cumulative = ordered.cumsum(dim=-1)
    decided = cumulative.gather(1, counts[:, None] - 1)[:, 0] >= top_p[rows] + MASS_MARGIN
    kept = (cumulative - ordered < top_p[rows, None]) & (torch.arange(width) < counts[:, None]) & decided[:, None]
    kept_row, kept_slot = kept.nonzero(as_tuple=True)
    keep[rows[kept_row], token.gather(1, order)[kept_row, kept_slot]] = True
    return rows[~decided]
