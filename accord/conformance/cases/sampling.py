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


CASES = {"sample": sample_cases}
