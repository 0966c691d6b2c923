"""The measured workloads: seeded random prompts with exact output lengths (batch-1
128 -> 128, repeated on fresh prompts; 32 x 128 -> 128; a mix of 32..512 -> 32..256)."""

from __future__ import annotations

import argparse
import random
from dataclasses import dataclass


@dataclass(frozen=True)
class TraceRequest:
    """One request of the trace: random prompt tokens and an exact output length."""

    prompt_token_ids: list[int]
    output_len: int


def make_trace(num_requests: int, seed: int, vocab_size: int) -> list[TraceRequest]:
    """The seeded trace: prompts of 32..512 tokens, outputs of 32..256 tokens."""
    rng = random.Random(seed)
    return [
        TraceRequest([rng.randrange(3, vocab_size) for _ in range(rng.randint(32, 512))], rng.randint(32, 256))
        for _ in range(num_requests)
    ]


#: The batch-1 workload's name: the one that is repeated and held to the roofline.
BATCH1 = "batch-1 128->128"


def workloads(args: argparse.Namespace, vocab: int) -> dict[str, list[list[TraceRequest]]]:
    """The three measured workloads over token ids below `vocab`, by name, all seeded:
    each the trace of every run, `--batch1-repeats` runs of batch 1 (fresh prompts each,
    drawn apart so that the other workloads do not depend on the count), one of the rest."""
    batch1_rng, rng = random.Random(args.seed + 2), random.Random(args.seed + 1)

    def fixed(rng: random.Random, count: int) -> list[TraceRequest]:
        return [TraceRequest([rng.randrange(3, vocab) for _ in range(128)], 128) for _ in range(count)]

    return {
        BATCH1: [fixed(batch1_rng, 1) for _ in range(args.batch1_repeats)],
        "32 x 128->128": [fixed(rng, 32)],
        f"{args.num_requests} mixed": [make_trace(args.num_requests, args.seed, vocab)],
    }
