"""Reference sampler: greedy or temperature sampling with top-k, top-p and min-p
filters and the contract's seeded exponential-race draw, one row at a time."""

from __future__ import annotations

import torch

from ._registry import KERNELS

#: Rows with a temperature below this are greedy.
GREEDY_TEMPERATURE = 1e-5


def _renormalised(probs: torch.Tensor, keep: torch.Tensor) -> torch.Tensor:
    kept = torch.where(keep, probs, torch.zeros_like(probs))
    return kept / kept.sum()


def _filtered(probs: torch.Tensor, top_k: int, top_p: float, min_p: float) -> torch.Tensor:
    """`probs` after the contract's top-k, top-p and min-p filters, in that order."""
    if top_k > 0:
        kth_largest = probs.topk(min(top_k, probs.numel())).values[-1]
        probs = _renormalised(probs, probs >= kth_largest)
    if top_p < 1.0:
        ordered, order = probs.sort(descending=True, stable=True)
        preceding = ordered.cumsum(0) - ordered
        keep = torch.zeros_like(probs, dtype=torch.bool)
        keep[order] = preceding < top_p
        probs = _renormalised(probs, keep)
    if min_p > 0.0:
        probs = _renormalised(probs, probs >= min_p * probs.max())
    return probs


def filtered_distribution(
    logits: torch.Tensor, temperature: torch.Tensor, top_k: torch.Tensor, top_p: torch.Tensor, min_p: torch.Tensor
) -> torch.Tensor:
    """[B, V]: the distribution each row draws from under the contract (tempered, then
    filtered and renormalised; one-hot at the first maximum for a greedy row), the
    golden conformance tests a backend's draws against."""
    # Many-seed batches repeat one row: each distinct (logits, settings) row once.
    settings = torch.stack([temperature.float(), top_k.float(), top_p.float(), min_p.float()], dim=1)
    distinct, row_of = torch.unique(torch.cat([logits.float(), settings], dim=1), dim=0, return_inverse=True)
    rows = []
    for key in distinct:
        row, (temp, k, p, m) = key[:-4], key[-4:].tolist()
        if temp < GREEDY_TEMPERATURE:
            rows.append(torch.zeros_like(row).index_fill_(0, torch.argmax(row).view(1), 1.0))
        else:
            rows.append(_filtered(torch.softmax(row / temp, dim=0), int(k), p, m))
    return torch.stack(rows)[row_of] if rows else torch.zeros(logits.shape)


def _draw(probs: torch.Tensor, seed: int) -> int:
    """The contract's exponential race: argmax(p / -log(u)), u seeded per row."""
    generator = torch.Generator("cpu").manual_seed(seed)
    uniform = torch.rand(probs.numel(), generator=generator)
    return int(torch.argmax(probs / -torch.log(uniform)))


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
    for b, row in enumerate(logits.float()):
        temp = float(temperature[b])
        if temp < GREEDY_TEMPERATURE:
            token = int(torch.argmax(row))  # torch.argmax returns the first maximum
        else:
            probs = _filtered(torch.softmax(row / temp, dim=0), int(top_k[b]), float(top_p[b]), float(min_p[b]))
            token = _draw(probs, int(seeds[b]))
        raw_logprobs = torch.log_softmax(row.double(), dim=0)
        token_ids[b] = token
        logprobs[b] = raw_logprobs[token]
        if num_logprobs > 0:
            best = raw_logprobs.topk(num_logprobs)
            top_logprobs[b] = best.values
            top_token_ids[b] = best.indices


def _race(probs: torch.Tensor, uniform: torch.Tensor) -> int:
    """The contract's exponential race over a given uniform row: argmax of p / -log(u)
    among tokens with p > 0 (so a u of 0 never lets an excluded token win)."""
    return int(torch.argmax(torch.where(probs > 0, probs / -torch.log(uniform), -1.0)))


@KERNELS.register("rejection_sample")
def rejection_sample(
    target_logits: torch.Tensor,
    draft_token_ids: torch.Tensor,
    num_draft_tokens: torch.Tensor,
    draft_probs: torch.Tensor | None,
    temperature: torch.Tensor,
    top_k: torch.Tensor,
    top_p: torch.Tensor,
    min_p: torch.Tensor,
    uniforms: torch.Tensor,
    race_uniforms: torch.Tensor,
    output_token_ids: torch.Tensor,
    num_accepted: torch.Tensor,
) -> None:
    """Accept drafts one at a time, per row, then emit the recovered or bonus token."""
    output_token_ids.fill_(-1)
    for b in range(target_logits.shape[0]):
        temp, drafts = float(temperature[b]), int(num_draft_tokens[b])
        accepted, emitted = 0, None
        for j in range(drafts + 1):
            row = target_logits[b, j].float()
            if temp < GREEDY_TEMPERATURE:
                best = int(torch.argmax(row))
                if j < drafts and int(draft_token_ids[b, j]) == best:
                    accepted += 1
                    continue
                emitted = best
                break
            probs = _filtered(torch.softmax(row / temp, dim=0), int(top_k[b]), float(top_p[b]), float(min_p[b]))
            if j == drafts:  # every draft accepted: the bonus token
                emitted = _race(probs, race_uniforms[b])
                break
            draft = int(draft_token_ids[b, j])
            if draft_probs is None:
                draft_dist = torch.zeros_like(probs).index_fill_(0, torch.tensor([draft]), 1.0)
            else:
                draft_dist = draft_probs[b, j].float()
            if bool(uniforms[b, j] * draft_dist[draft] < probs[draft]):  # fp32, as the contract's kernels
                accepted += 1
                continue
            residual = (probs - draft_dist).clamp_(min=0.0)
            emitted = _race(residual if bool((residual > 0).any()) else probs, race_uniforms[b])
            break
        output_token_ids[b, :accepted] = draft_token_ids[b, :accepted]
        output_token_ids[b, accepted] = emitted
        num_accepted[b] = accepted
