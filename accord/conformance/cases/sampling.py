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


#: Filter settings at temperatures other than 1, so the order of temperature and
#: filtering (temperature first) decides which tokens survive.
TEMPERED_FILTERS = ((0.5, 0, 0.8, 0.0), (2.0, 0, 1.0, 0.2), (0.7, 6, 0.9, 0.05))
#: Draws per filter setting in the many-seed cases: enough that every token the
#: filter keeps is drawn several times, so a boundary token wrongly kept or dropped
#: shows in the token ids.
DRAWS = 256


def _ladder(generator: torch.Generator, dtype: torch.dtype) -> torch.Tensor:
    """One row of distinct, well separated logits (a shuffled ladder of exact values),
    so filter boundaries never sit on a rounding tie."""
    return ((torch.arange(VOCAB) - VOCAB / 2) * 0.125)[torch.randperm(VOCAB, generator=generator)].to(dtype)


def tempered_many_seed_cases(seed: int) -> Iterator[Case]:
    """Each tempered filter setting on one logits row repeated DRAWS times with
    distinct seeds: the draws sample the filtered distribution."""
    for dtype in FLOAT_DTYPES:
        for temperature, top_k, top_p, min_p in TEMPERED_FILTERS:
            g = seeded(seed, "sample many seeds", dtype, temperature, top_k, top_p, min_p)
            args = {
                "logits": _ladder(g, dtype).expand(DRAWS, VOCAB).contiguous(),
                "temperature": torch.full((DRAWS,), temperature),
                "top_k": torch.full((DRAWS,), top_k, dtype=torch.int32),
                "top_p": torch.full((DRAWS,), top_p),
                "min_p": torch.full((DRAWS,), min_p),
                "seeds": torch.arange(DRAWS, dtype=torch.int64) + 7919 * seed + 1,
                "num_logprobs": 0,
            }
            name = f"{DRAWS} seeds T={temperature} top_k={top_k} top_p={top_p} min_p={min_p}"
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
    """The filter rows, the tempered many-seed draws and the greedy ties."""
    yield from sample_cases(seed)
    yield from tempered_many_seed_cases(seed)
    yield from greedy_tie_cases(seed)


CASES = {"sample": all_sample_cases}
