"""Cost per block of the prefix-cache key hashes (`--prefix-caching-hash-algo`):
SHA-256 (collision-resistant, the default) against Python's builtin hash, side by
side in one run, at the usual block sizes.

    PYTHONPATH=$PWD python3 benchmarks/prefix_hash.py
"""

from __future__ import annotations

import random
import time

from accord.core.sched.block_manager import PREFIX_HASH_ALGOS, ROOT_KEY

NUM_BLOCKS = 20_000
REPEATS = 5


def cost_per_block_ns(algo: str, block_size: int) -> float:
    """Median over REPEATS of the mean ns to key one block of a long chain."""
    key_of = PREFIX_HASH_ALGOS[algo]
    rng = random.Random(0)
    blocks = [[rng.randrange(150_000) for _ in range(block_size)] for _ in range(NUM_BLOCKS)]
    times = []
    for _ in range(REPEATS):
        start = time.perf_counter_ns()
        parent = ROOT_KEY
        for block in blocks:
            parent = key_of(parent, block)
        times.append((time.perf_counter_ns() - start) / NUM_BLOCKS)
    return sorted(times)[REPEATS // 2]


def main() -> None:
    print(f"{'block size':>10} {'builtin ns':>11} {'sha256 ns':>10} {'ratio':>6}")
    for block_size in (16, 32, 64, 128):
        builtin, sha256 = cost_per_block_ns("builtin", block_size), cost_per_block_ns("sha256", block_size)
        print(f"{block_size:>10} {builtin:>11.0f} {sha256:>10.0f} {sha256 / builtin:>6.2f}")


if __name__ == "__main__":
    main()
