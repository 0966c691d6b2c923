"""The sampler, batched: greedy rows take one argmax and never touch an RNG; sampled
rows share the tempering, softmax and filters as [n, V] tensor ops and only the seeded
uniform draws run one row at a time. Each step performs the same per-element
operations as the reference's row loop, so the draws agree bit for bit."""

from __future__ import annotations

import torch

from ._registry import KERNELS
from ._top_p import keep_top_p

#: Rows with a temperature below this are greedy.
GREEDY_TEMPERATURE = 1e-5


def _renormalise_rows(probs: torch.Tensor, rows: torch.Tensor, keep: torch.Tensor) -> None:
    """Reduce `probs[rows]` to their `keep` entries and renormalise them, in place;
    other rows stay untouched (a filter that is off must not re-round its row)."""
    kept = probs[rows].masked_fill_(~keep, 0.0)
    probs[rows] = kept / kept.sum(dim=-1, keepdim=True)


def _filter(probs: torch.Tensor, top_k: torch.Tensor, top_p: torch.Tensor, min_p: torch.Tensor) -> None:
    """Apply the contract's top-k, top-p and min-p filters to `probs` [n, V] in place,
    in that order, each only to the rows that set it."""
    rows = (top_k > 0).nonzero().squeeze(1)
    if rows.numel():
        subset, ks = probs[rows], top_k[rows].clamp(max=probs.shape[1]).long()
        kth_largest = subset.topk(int(ks.max()), dim=-1).values.gather(1, ks[:, None] - 1)
        _renormalise_rows(probs, rows, subset >= kth_largest)
    rows = (top_p < 1.0).nonzero().squeeze(1)
    if rows.numel():
        _renormalise_rows(probs, rows, keep_top_p(probs[rows], top_p[rows]))
    rows = (min_p > 0.0).nonzero().squeeze(1)
    if rows.numel():
        subset = probs[rows]
        _renormalise_rows(probs, rows, subset >= min_p[rows, None] * subset.amax(dim=-1, keepdim=True))


def _exponential_race(probs: torch.Tensor, seeds: list[int]) -> torch.Tensor:
    """The contract's draw per row: argmax(p / -log(u)), u from a CPU generator seeded
    with the row's seed (drawn on the host, so the draw is the same on any device that
    runs this kernel)."""
    uniform = torch.empty(probs.shape, dtype=probs.dtype)
    for row, seed in enumerate(seeds):
        torch.rand(probs.shape[1], generator=torch.Generator("cpu").manual_seed(seed), out=uniform[row])
    return torch.argmax(probs / uniform.to(probs.device).log_().neg_(), dim=-1)


@KERNELS.register("sample")
def sample(
    logits: torch.Tensor,
    temperature: torch.Tensor,
    top_k: torch.Tensor,
    top_p: torch.Tensor,
    min_p: torch.Tensor,
    seeds: torch.Tensor,
    num_logprobs: int,
    token_ids: torch.Tensor,
    logprobs: torch.Tensor,
    top_logprobs: torch.Tensor,
    top_token_ids: torch.Tensor,
) -> None:
    """One token per row, with logprobs of the raw (unfiltered, untempered) logits."""
    rows = logits.float()
    torch.argmax(rows, dim=-1, out=token_ids)  # greedy rows' answer; sampled rows overwrite
    sampled = (temperature >= GREEDY_TEMPERATURE).nonzero().squeeze(1)
    if sampled.numel():
        probs = torch.softmax(rows.index_select(0, sampled) / temperature.index_select(0, sampled)[:, None], dim=-1)
        _filter(probs, top_k[sampled], top_p[sampled], min_p[sampled])
        token_ids.index_copy_(0, sampled, _exponential_race(probs, seeds[sampled].tolist()))
    # log_softmax(x) = x - logsumexp(x): only the chosen and top entries are needed.
    log_normaliser = torch.logsumexp(rows, dim=-1, keepdim=True)
    torch.sub(rows.gather(1, token_ids[:, None]), log_normaliser, out=logprobs[:, None])
    if num_logprobs > 0:
        best = rows.topk(num_logprobs, dim=-1)
        torch.sub(best.values, log_normaliser, out=top_logprobs)
        top_token_ids.copy_(best.indices)
