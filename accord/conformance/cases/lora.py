"""Cases for the multi-LoRA delta: mixed slots and base (-1) rows in one batch, ranks
8 to 64, one adapter only, no adapter at all, one decode row, one token per slot, a long
run of one slot, and resident slots no row names (filled with NaN, so a kernel that
reads a slot the batch does not use fails). Each at every float dtype."""

from __future__ import annotations

from typing import Iterator

import torch

from ...op_contracts import FLOAT_DTYPES
from ..case import Case, randn, seeded

#: (name, rows T, input features K, output features N, slots S, rank R, each row's slot
#: or None for a seeded mix of every slot and -1).
LORA_SHAPES = (
    ("mixed slots and base rows", 9, 48, 40, 3, 8, None),
    ("rank 16 fused qkv width", 6, 32, 96, 4, 16, None),
    ("rank 64", 5, 80, 24, 2, 64, None),
    ("one adapter only", 4, 40, 56, 3, 8, (1, 1, 1, 1)),
    ("base rows only", 3, 24, 16, 2, 8, (-1, -1, -1)),
    ("one decode row", 1, 64, 48, 4, 16, (3,)),
    ("unused slots", 5, 32, 32, 4, 8, (0, -1, 2, 0, -1)),
    # A decode batch of many adapters: every slot named by one token.
    ("one token per slot", 16, 72, 40, 16, 16, tuple(range(15, -1, -1))),
    # A prefill chunk: a long run of one slot (more tokens than a kernel's block of them,
    # a width past a block of output columns) with base rows between, large enough that
    # a threaded kernel splits it.
    ("many rows of one slot", 37, 200, 136, 2, 24, tuple(1 if i % 5 else -1 for i in range(37))),
)


def lora_cases(seed: int) -> Iterator[Case]:
    """y, x and the slots' A and B (B scaled small, as a trained adapter's delta is) at
    each float dtype; slots no row names hold NaN."""
    for dtype in FLOAT_DTYPES:
        for name, tokens, depth, width, slots, rank, fixed in LORA_SHAPES:
            g = seeded(seed, "lora_linear", dtype, name)
            if fixed is None:
                slot_ids = torch.randint(-1, slots, (tokens,), generator=g, dtype=torch.int32)
            else:
                slot_ids = torch.tensor(fixed, dtype=torch.int32)
            lora_a = randn(g, (slots, rank, depth), dtype, depth**-0.5)
            lora_b = randn(g, (slots, rank, width), dtype, 0.5 * rank**-0.5)
            for unused in sorted(set(range(slots)) - set(slot_ids.tolist())):
                lora_a[unused] = float("nan")
                lora_b[unused] = float("nan")
            args = {
                "y": randn(g, (tokens, width), dtype),
                "x": randn(g, (tokens, depth), dtype),
                "lora_a": lora_a,
                "lora_b": lora_b,
                "slot_ids": slot_ids,
            }
            yield Case("lora_linear", f"{name} T={tokens} K={depth} N={width} S={slots} R={rank}", args,
                       row_independent=True)


CASES = {"lora_linear": lora_cases}
