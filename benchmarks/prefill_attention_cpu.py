"""Micro-benchmark of the cpu backend's prefill attention on the 152M bench model's
shapes (16 query and 4 kv heads of 64, bf16 query and cache, block size 16, blocks
scattered over the cache): one whole prompt of each length, through the cpu kernel
`paged_attention`, old path against new side by side in one process.

    python benchmarks/prefill_attention_cpu.py [--lengths 128 512 2048] [--threads 1 2] [--repeat 5]

Paths: `sdpa` is the torch path the cpu backend took before the C kernel (gather, cast
to fp32, repeat each kv head for its group, one fp32 SDPA call), `c-fp32` and
`c-avx512bf16` the C kernel (paged_prefill_attention.c) on each query . key path (the
latter only where the CPU has AVX512-BF16). Prints the best of `repeat` calls in ms of
wall time (the kernels use `--threads` threads) and each path's largest difference from
the sdpa output.
"""

from __future__ import annotations

import argparse
import time
from typing import Any, Callable

import torch

from accord.backends.cpu.kernels import _native_attention, attention
from accord.backends.cpu.kernels._native_attention import Isa

Q_HEADS, KV_HEADS, HEAD_DIM, BLOCK_SIZE = 16, 4, 64, 16


def _case(length: int) -> tuple[Any, ...]:
    """paged_attention's arguments for one whole prompt of `length` positions."""
    blocks = -(-length // BLOCK_SIZE)
    caches = [torch.randn(blocks, BLOCK_SIZE, KV_HEADS, HEAD_DIM).bfloat16() for _ in range(2)]
    tables = torch.randperm(blocks, dtype=torch.int32).reshape(1, blocks)
    query = torch.randn(length, Q_HEADS, HEAD_DIM).bfloat16()
    seq_lens = torch.tensor([length], dtype=torch.int32)
    query_start_loc = torch.tensor([0, length], dtype=torch.int32)
    return query, *caches, tables, seq_lens, query_start_loc, HEAD_DIM**-0.5, 0, 1.0, 1.0, torch.empty_like(query)


def _paths() -> dict[str, Callable[[], None]]:
    """How to put the cpu kernel on each path (a setter to call before timing it)."""
    original = _native_attention.attend_prefills

    def on(isa: Isa | None) -> Callable[[], None]:
        def set_path() -> None:
            if isa is None:  # the torch path: the prefill kernel declines every call
                _native_attention.attend_prefills = lambda *args, **kwargs: False
            else:
                _native_attention.attend_prefills = lambda *args, **kwargs: original(*args, **kwargs, isa=isa)
        return set_path

    paths = {"sdpa": on(None), "c-fp32": on(Isa.FP32)}
    with open("/proc/cpuinfo") as cpuinfo:
        if "avx512_bf16" in cpuinfo.read():
            paths["c-avx512bf16"] = on(Isa.AVX512_BF16)
    return paths


def _time(args: tuple[Any, ...], repeat: int) -> float:
    """Best of `repeat` calls, in ms of wall time."""
    best = float("inf")
    for _ in range(repeat):
        start = time.perf_counter()
        attention.paged_attention(*args)
        best = min(best, time.perf_counter() - start)
    return best * 1e3


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--lengths", type=int, nargs="+", default=[128, 512, 2048])
    parser.add_argument("--threads", type=int, nargs="+", default=[1, 2])
    parser.add_argument("--repeat", type=int, default=5)
    opts = parser.parse_args()
    torch.manual_seed(0)
    paths = _paths()
    print(f"{'tokens':>6} {'threads':>7} " + " ".join(f"{name:>14}" for name in paths) + "  max |diff| vs sdpa")
    for length in opts.lengths:
        args = _case(length)
        for threads in opts.threads:
            torch.set_num_threads(threads)
            outputs, times = {}, {}
            for name, set_path in paths.items():
                set_path()
                attention.paged_attention(*args)  # warm: builds, workspaces
                outputs[name] = args[-1].float().clone()
                times[name] = _time(args, opts.repeat)
            diffs = [f"{(outputs[n] - outputs['sdpa']).abs().max().item():.2g}" for n in paths if n != "sdpa"]
            speedups = [f"{times[n]:8.2f} ({times['sdpa'] / times[n]:.2f}x)" if n != "sdpa" else f"{times[n]:14.2f}"
                        for n in paths]
            print(f"{length:>6} {threads:>7} " + " ".join(f"{s:>14}" for s in speedups) + "  " + " ".join(diffs))


if __name__ == "__main__":
    main()
