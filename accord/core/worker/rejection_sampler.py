"""Checks a step's drafted tokens: the target's logits at each drafted position (and
the one after) go through the `rejection_sample` op with per-request seeded uniforms,
which keeps the drafts the target would have drawn and emits the token after them.

A seeded request's uniforms depend only on its seed and how many tokens it has
generated, never on its batch mates, so it reproduces alone or batched (as the
sampler's draws). Logprobs of the emitted tokens are those of the raw logits at their
positions, as the sampler reports them.
"""

from __future__ import annotations

import random
from collections.abc import Sequence

import torch

from ...op_contracts import OpDispatcher
from ...op_contracts.workspace import Workspace
from .sampler import SampledTokens, SamplingRow, draw_seed, prompt_logprobs


class RejectionSampler:
    """The emitted tokens of requests whose step checked drafts."""

    def __init__(self, ops: OpDispatcher, rng: random.Random) -> None:
        self.ops = ops
        #: Shared with the sampler: unseeded requests draw their per-step seeds from it.
        self._rng = rng
        #: The padded logits' memory, kept from step to step (`_padded_logits`).
        self._workspace = Workspace()

    def __call__(
        self,
        logits: torch.Tensor,
        seqs: Sequence[SamplingRow],
        drafts: Sequence[Sequence[int]],
        draft_probs: Sequence[torch.Tensor | None] | None = None,
    ) -> list[SampledTokens]:
        """Per request b: its accepted drafts and the token after them. `logits` ([R, V]
        fp32) holds each request's 1 + len(drafts[b]) rows back to back, in order.
        `draft_probs[b]` ([len(drafts[b]), V]) is the distribution a draft model drew
        request b's drafts from (None, or no list: each draft is a point mass)."""
        batch, vocab, device = len(seqs), logits.shape[1], logits.device
        width = max(len(d) for d in drafts)
        counts = [len(d) for d in drafts]
        starts = [0]
        for count in counts:
            starts.append(starts[-1] + count + 1)
        padded = self._padded_logits(logits, starts, width)
        draft_ids = torch.zeros(batch, width, dtype=torch.int64)
        for b, draft in enumerate(drafts):
            draft_ids[b, : len(draft)] = torch.tensor(draft, dtype=torch.int64)
        params = [seq.params for seq in seqs]
        uniforms = torch.zeros(batch, width)
        race_uniforms = torch.full((batch, vocab), 0.5)
        for b, seq in enumerate(seqs):
            if not params[b].greedy:
                generator = torch.Generator("cpu").manual_seed(draw_seed(seq, self._rng))
                torch.rand(width, generator=generator, out=uniforms[b])
                torch.rand(vocab, generator=generator, out=race_uniforms[b])
        output, accepted = self.ops.rejection_sample(
            padded,
            draft_ids.to(device),
            torch.tensor(counts, dtype=torch.int32, device=device),
            _padded_draft_probs(draft_probs, draft_ids, vocab, device),
            torch.tensor([p.temperature for p in params], dtype=torch.float32, device=device),
            torch.tensor([p.top_k for p in params], dtype=torch.int32, device=device),
            torch.tensor([p.top_p for p in params], dtype=torch.float32, device=device),
            torch.tensor([p.min_p for p in params], dtype=torch.float32, device=device),
            uniforms.to(device),
            race_uniforms.to(device),
        )
        results = []
        for b, (row, num) in enumerate(zip(output.tolist(), accepted.tolist())):
            tokens = row[: num + 1]
            wanted = params[b].logprobs
            if wanted is None:
                results.append(SampledTokens(tokens, [None] * len(tokens), [None] * len(tokens)))
                continue
            entries = prompt_logprobs(logits[starts[b] : starts[b] + len(tokens)], tokens, wanted)
            chosen = [entry[token].logprob for entry, token in zip(entries, tokens)]
            results.append(SampledTokens(tokens, chosen, list(entries)))
        return results

    def _padded_logits(self, logits: torch.Tensor, starts: list[int], width: int) -> torch.Tensor:
        """[B, width + 1, V]: request b's rows `logits[starts[b]:starts[b + 1]]`, then
        zeros. Its memory is kept from step to step: a fresh tensor this size (56 MB at
        32 requests, k = 8 and a 49k vocabulary) cost about ten times the copies in page
        faults on this project's CPU hosts (the allocator maps it anew every time)."""
        shape = (len(starts) - 1, width + 1, logits.shape[1])
        padded = self._workspace.take("padded logits", shape, logits.dtype, logits.device)
        for b, (start, end) in enumerate(zip(starts, starts[1:])):
            padded[b, : end - start] = logits[start:end]
            padded[b, end - start :] = 0
        return padded


def _padded_draft_probs(
    draft_probs: Sequence[torch.Tensor | None] | None, draft_ids: torch.Tensor, vocab: int, device: torch.device
) -> torch.Tensor | None:
    """[B, K, V]: each request's draft distributions, point masses on its drafts where it
    has none (a greedy request); None when no request has any."""
    if draft_probs is None or all(probs is None for probs in draft_probs):
        return None
    padded = torch.zeros(*draft_ids.shape, vocab)
    for b, probs in enumerate(draft_probs):
        if probs is None:
            padded[b].scatter_(1, draft_ids[b, :, None], 1.0)
        else:
            padded[b, : len(probs)] = probs
    return padded.to(device)
