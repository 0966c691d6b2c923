"""Cases for the rejection sampler: greedy argmax chains (all, some, none accepted),
sampled rows with point-mass and distribution drafts under every filter, edges (k = 1,
rows without drafts, a draft the draft distribution gives probability 0), and many
seeds over one row so the emitted tokens are judged as draws (conformance/draws.py:
the first token, and the one after an accepted draft, fit the target's distribution
whatever the draft)."""

from __future__ import annotations

from typing import Iterator

import torch

from ...op_contracts import FLOAT_DTYPES
from ..case import Case, randn, seeded
from .sampling import DRAW_VOCAB, DRAWS, FILTER_SETTINGS, _ladder

VOCAB = 32
K = 3


def _settings(rows: list[tuple[float, int, float, float]]) -> dict[str, torch.Tensor]:
    return {
        "temperature": torch.tensor([r[0] for r in rows]),
        "top_k": torch.tensor([r[1] for r in rows], dtype=torch.int32),
        "top_p": torch.tensor([r[2] for r in rows]),
        "min_p": torch.tensor([r[3] for r in rows]),
    }


def _draft_distribution(g: torch.Generator, rows: int, k: int, vocab: int) -> torch.Tensor:
    """A draft's filtered distributions: softmax of other logits, top-8 kept."""
    probs = torch.softmax(torch.randn(rows, k, vocab, generator=g) * 2, dim=-1)
    kth = probs.topk(min(8, vocab), dim=-1).values[..., -1:]
    probs = torch.where(probs >= kth, probs, torch.zeros_like(probs))
    return probs / probs.sum(-1, keepdim=True)


def _call(g: torch.Generator, logits: torch.Tensor, drafts: torch.Tensor, num: list[int],
          draft_probs: torch.Tensor | None, rows: list[tuple[float, int, float, float]]) -> dict[str, object]:
    batch, k = drafts.shape
    return {
        "target_logits": logits,
        "draft_token_ids": drafts,
        "num_draft_tokens": torch.tensor(num, dtype=torch.int32),
        "draft_probs": draft_probs,
        **_settings(rows),
        "uniforms": torch.rand(batch, k, generator=g),
        "race_uniforms": torch.rand(batch, logits.shape[2], generator=g),
    }


def greedy_cases(seed: int) -> Iterator[Case]:
    """Greedy rows: drafts equal to the argmax chain for 3, 1 and 0 positions, one row
    with fewer drafts than K, one with none."""
    for dtype in FLOAT_DTYPES:
        g = seeded(seed, "rejection greedy", dtype)
        logits = randn(g, (5, K + 1, VOCAB), dtype, 3.0)
        chain = logits.float().argmax(-1)[:, :K].clone()
        drafts = chain.clone()
        drafts[1, 1] = (chain[1, 1] + 1) % VOCAB  # accepts 1
        drafts[2, 0] = (chain[2, 0] + 1) % VOCAB  # accepts none
        args = _call(g, logits, drafts, [K, K, K, 2, 0], None, [(0.0, 0, 1.0, 0.0)] * 5)
        yield Case("rejection_sample", f"greedy B=5 K={K} V={VOCAB}", args, row_independent=True)


def sampled_cases(seed: int) -> Iterator[Case]:
    """Sampled rows with each filter, greedy rows beside them, point-mass and
    distribution drafts, k = 1 and K, and a draft whose draft probability is 0."""
    rows = [(0.0, 0, 1.0, 0.0), (0.8, 5, 1.0, 0.0), (1.0, 0, 0.9, 0.0), (1.2, 0, 1.0, 0.1), (0.7, 6, 0.9, 0.05)]
    for dtype in FLOAT_DTYPES:
        for k in (1, K):
            for with_probs in (False, True):
                g = seeded(seed, "rejection sampled", dtype, k, with_probs)
                logits = randn(g, (len(rows), k + 1, VOCAB), dtype, 2.0)
                draft_probs = _draft_distribution(g, len(rows), k, VOCAB) if with_probs else None
                if draft_probs is None:
                    drafts = torch.randint(0, VOCAB, (len(rows), k), generator=g)
                else:
                    drafts = torch.multinomial(draft_probs.view(-1, VOCAB), 1, generator=g).view(len(rows), k)
                    zero = int(draft_probs[1, 0].argmin())  # the draft never proposes it
                    drafts[1, 0] = zero
                num = [k] * len(rows)
                num[-1] = k - 1
                name = f"sampled B={len(rows)} K={k} V={VOCAB} {'draft probs' if with_probs else 'point drafts'}"
                yield Case("rejection_sample", name, _call(g, logits, drafts, num, draft_probs, rows),
                           row_independent=True)


def many_seed_cases(seed: int) -> Iterator[Case]:
    """One target row per filter setting, repeated DRAWS times with distinct uniforms:
    with a point-mass draft (a token the target gives a few percent, so both branches
    run) and with drafts drawn from a draft distribution unlike the target's."""
    for temperature, top_k, top_p, min_p in FILTER_SETTINGS:
        for with_probs in (False, True):
            g = seeded(seed, "rejection many seeds", temperature, top_k, top_p, min_p, with_probs)
            k = 2
            logits = torch.stack([_ladder(g, torch.float32, DRAW_VOCAB) for _ in range(k + 1)])
            if with_probs:
                draft_probs = _draft_distribution(g, 1, k, DRAW_VOCAB).expand(DRAWS, k, DRAW_VOCAB).contiguous()
                drafts = torch.multinomial(draft_probs.view(-1, DRAW_VOCAB), 1, generator=g).view(DRAWS, k)
            else:
                draft_probs = None
                # The target's median token at each position: accepted about half the time.
                drafts = logits.argsort(-1)[:k, DRAW_VOCAB // 2].expand(DRAWS, k).contiguous()
            args = _call(g, logits.expand(DRAWS, k + 1, DRAW_VOCAB).contiguous(), drafts, [k] * DRAWS,
                         draft_probs, [(temperature, top_k, top_p, min_p)] * DRAWS)
            name = (f"{DRAWS} seeds T={temperature} top_k={top_k} top_p={top_p} min_p={min_p} "
                    f"{'draft probs' if with_probs else 'point drafts'}")
            yield Case("rejection_sample", name, args)


def all_rejection_cases(seed: int) -> Iterator[Case]:
    """The greedy chains, the sampled rows and edges, and the many-seed draws."""
    yield from greedy_cases(seed)
    yield from sampled_cases(seed)
    yield from many_seed_cases(seed)


CASES = {"rejection_sample": all_rejection_cases}
