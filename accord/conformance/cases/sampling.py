"""Cases for the sampler: greedy and seeded random rows with top-k, top-p and min-p
filters side by side, with and without top logprobs."""

from __future__ import annotations

from typing import Iterator

import torch

from ...op_contracts import FLOAT_DTYPES
from ..case import Case, randn, seeded

VOCAB = 64
#: One row per filter: (temperature, top_k, top_p, min_p); row 0 is greedy.
ROW_SETTINGS = ((0.0, 0, 1.0, 0.0), (0.8, 5, 1.0, 0.0), (1.0, 0, 0.9, 0.0), (1.2, 0, 1.0, 0.1))


def sample_cases(seed: int) -> Iterator[Case]:
    """logits dtype x batch (one greedy row; every filter) x number of top logprobs."""
    for dtype in FLOAT_DTYPES:
        for rows in (1, len(ROW_SETTINGS)):
            for num_logprobs in (0, 3):
                g = seeded(seed, "sample", dtype, rows, num_logprobs)
                settings = ROW_SETTINGS[:rows]
                args = {
                    "logits": randn(g, (rows, VOCAB), dtype, 3.0),
                    "temperature": torch.tensor([s[0] for s in settings]),
                    "top_k": torch.tensor([s[1] for s in settings], dtype=torch.int32),
                    "top_p": torch.tensor([s[2] for s in settings]),
                    "min_p": torch.tensor([s[3] for s in settings]),
                    "seeds": torch.arange(rows, dtype=torch.int64) + 1000 * seed + 7,
                    "num_logprobs": num_logprobs,
                }
                yield Case("sample", f"B={rows} V={VOCAB} logprobs={num_logprobs}", args, row_independent=True)


#: (temperature, top_k, top_p, min_p) of the many-seed cases: each filter alone, a
#: combination, and filters at temperatures other than 1, so the order of temperature
#: and filtering (temperature first) decides which tokens survive.
FILTER_SETTINGS = (
    (1.0, 5, 1.0, 0.0),
    (1.0, 0, 0.9, 0.0),
    (1.0, 0, 1.0, 0.1),
    (1.0, 8, 0.95, 0.02),
    (0.5, 0, 0.8, 0.0),
    (2.0, 0, 1.0, 0.2),
    (0.7, 6, 0.9, 0.05),
    # On the ladder (each token e^-0.5 of the one above) top-p 0.7 keeps 2 of the top 3
    # after top-k's renormalisation, but all 3 if applied before it: the order shows.
    (1.0, 3, 0.7, 0.0),
)
#: The top-k of the tied-boundary case: the ladder's 5th and 6th tokens share a logit.
TIED_TOP_K = 5
#: Draws per filter setting in the many-seed cases, over a small vocabulary (so each
#: boundary token carries a few percent of the mass): enough that a token a filter
#: wrongly keeps is drawn, and one it wrongly drops is missed by far more than chance
#: allows (the chi-square check), besides showing in the token ids.
DRAWS = 512
DRAW_VOCAB = 16


def _ladder(generator: torch.Generator, dtype: torch.dtype, vocab: int = VOCAB) -> torch.Tensor:
    """One row of distinct, well separated logits (a shuffled ladder of exact values,
    8 wide in all), so filter boundaries never sit on a rounding tie."""
    return ((torch.arange(vocab) - vocab / 2) * (8 / vocab))[torch.randperm(vocab, generator=generator)].to(dtype)


def _tied_at_kth(ladder: torch.Tensor, k: int) -> torch.Tensor:
    """`ladder` with its (k+1)-th largest logit raised to the k-th's: a tie at the
    top-k boundary, which the contract keeps whole (every token >= the k-th)."""
    order = ladder.argsort(descending=True)
    tied = ladder.clone()
    tied[order[k]] = ladder[order[k - 1]]
    return tied


def many_seed_cases(seed: int) -> Iterator[Case]:
    """Each filter setting on one logits row repeated DRAWS times with
    distinct seeds: the draws sample the filtered distribution. Then top-k on a row
    tied at its k-th token."""
    settings = [(setting, False) for setting in FILTER_SETTINGS] + [((1.0, TIED_TOP_K, 1.0, 0.0), True)]
    for dtype in (torch.bfloat16,):  # the filters run in fp32 whatever the logits' dtype
        for (temperature, top_k, top_p, min_p), tied in settings:
            g = seeded(seed, "sample many seeds", dtype, temperature, top_k, top_p, min_p)
            row = _ladder(g, dtype, DRAW_VOCAB)
            row = _tied_at_kth(row, top_k) if tied else row
            args = {
                "logits": row.expand(DRAWS, DRAW_VOCAB).contiguous(),
                "temperature": torch.full((DRAWS,), temperature),
                "top_k": torch.full((DRAWS,), top_k, dtype=torch.int32),
                "top_p": torch.full((DRAWS,), top_p),
                "min_p": torch.full((DRAWS,), min_p),
                "seeds": torch.arange(DRAWS, dtype=torch.int64) + 7919 * seed + 1,
                "num_logprobs": 0,
            }
            name = f"{DRAWS} seeds T={temperature} top_k={top_k} top_p={top_p} min_p={min_p}" + (
                " tied at the k-th" if tied else "")
            yield Case("sample", name, args)


def greedy_tie_cases(seed: int) -> Iterator[Case]:
    """Greedy rows whose maximum is tied between two or three tokens: the first index
    wins (the contract's rule)."""
    for dtype in FLOAT_DTYPES:
        g = seeded(seed, "sample greedy ties", dtype)
        logits = randn(g, (3, VOCAB), torch.float32).clamp(-2, 2)
        logits[0, [5, 40]] = 3.0
        logits[1, [0, 63]] = 3.0
        logits[2, [17, 18, 50]] = 3.0
        args = {
            "logits": logits.to(dtype),
            "temperature": torch.zeros(3),
            "top_k": torch.zeros(3, dtype=torch.int32),
            "top_p": torch.ones(3),
            "min_p": torch.zeros(3),
            "seeds": torch.arange(3, dtype=torch.int64),
            "num_logprobs": 0,
        }
        yield Case("sample", "greedy tied maxima", args, row_independent=True)


def all_sample_cases(seed: int) -> Iterator[Case]:
    """The filter rows, the many-seed draws per filter setting and the greedy ties."""
    yield from sample_cases(seed)
    yield from many_seed_cases(seed)
    yield from greedy_tie_cases(seed)


CASES = {"sample": all_sample_cases}
