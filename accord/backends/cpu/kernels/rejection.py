"""The rejection sampler, batched: greedy rows compare drafts with one argmax over all
their positions; sampled rows share the tempering, softmax and filters of the sample
kernel as [n, V] tensor ops, then the acceptance tests, the first rejection and the
emitted token's race for every row at once. The per-element operations are the
reference's, so the two agree token for token. Device-agnostic torch: the GPU and
Ascend backends run it as their own (their uniforms come made)."""

from __future__ import annotations

import torch

from ._registry import KERNELS
from .sampling import GREEDY_TEMPERATURE, _filter


def _leading_true(flags: torch.Tensor) -> torch.Tensor:
    """Per row of a [n, K] bool tensor: how many leading entries are True."""
    return flags.int().cumprod(dim=1).sum(dim=1, dtype=torch.int32)


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
    """Accepted drafts, then the recovered or bonus token, for every row."""
    batch, positions, vocab = target_logits.shape
    k, device = positions - 1, target_logits.device
    logits = target_logits.float()
    in_range = torch.arange(k, device=device)[None, :] < num_draft_tokens[:, None].long()
    # Greedy rows' answer; sampled rows overwrite theirs below.
    best = logits.argmax(dim=-1)
    accepted = _leading_true((draft_token_ids == best[:, :k]) & in_range)
    emitted = best.gather(1, accepted[:, None].long()).squeeze(1)
    sampled = (temperature >= GREEDY_TEMPERATURE).nonzero().squeeze(1)
    if sampled.numel():
        n = sampled.numel()
        rows = logits.index_select(0, sampled).reshape(n * positions, vocab)
        repeat = lambda t: t.index_select(0, sampled).repeat_interleave(positions)  # noqa: E731
        probs = torch.softmax(rows / repeat(temperature)[:, None], dim=-1)
        _filter(probs, repeat(top_k), repeat(top_p), repeat(min_p))
        probs = probs.view(n, positions, vocab)
        drafts = draft_token_ids.index_select(0, sampled)
        target_at_draft = probs[:, :k].gather(2, drafts[:, :, None]).squeeze(2)
        if draft_probs is None:
            draft_at_draft = torch.ones_like(target_at_draft)
        else:
            draft_at_draft = draft_probs.index_select(0, sampled).gather(2, drafts[:, :, None]).squeeze(2)
        passes = uniforms.index_select(0, sampled) * draft_at_draft < target_at_draft
        row_accepted = _leading_true(passes & in_range.index_select(0, sampled))
        # The distribution of the emitted token: p at the first rejection (less the
        # draft's, clamped), or p after the last draft (the bonus token).
        at = row_accepted.long()
        dist = probs[torch.arange(n, device=device), at]
        rejected = (at < num_draft_tokens.index_select(0, sampled).long()).nonzero().squeeze(1)
        if rejected.numel():
            rejected_at = at[rejected].clamp(max=max(k - 1, 0))
            if draft_probs is None:
                draft_dist = torch.zeros(rejected.numel(), vocab, device=device)
                draft_dist.scatter_(1, drafts[rejected, rejected_at][:, None], 1.0)
            else:
                draft_dist = draft_probs.index_select(0, sampled)[rejected, rejected_at].float()
            residual = (dist[rejected] - draft_dist).clamp_(min=0.0)
            usable = (residual > 0).any(dim=1, keepdim=True)
            dist[rejected] = torch.where(usable, residual, dist[rejected])
        race = race_uniforms.index_select(0, sampled)
        choice = torch.where(dist > 0, dist / -torch.log(race), torch.full_like(dist, -1.0)).argmax(dim=-1)
        accepted.index_copy_(0, sampled, row_accepted)
        emitted.index_copy_(0, sampled, choice)
    output_token_ids.fill_(-1)
    keep = torch.arange(positions, device=device)[None, :] < accepted[:, None]
    padded = torch.cat([draft_token_ids, draft_token_ids.new_full((batch, 1), -1)], dim=1)
    output_token_ids.copy_(torch.where(keep, padded, output_token_ids))
    output_token_ids.scatter_(1, accepted[:, None].long(), emitted[:, None])
    num_accepted.copy_(accepted)
