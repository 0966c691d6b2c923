"""Micro-benchmark of the cpu decode attention kernel (paged_decode_attention.c through
`_native_attention.attend_decodes`) on the 152M bench model's decode shapes: 16 query
and 4 kv heads of 64, block size 16, blocks scattered over the cache.

    python benchmarks/decode_attention_cpu.py [--baseline OLD.c] [--repeat 7] [--calls 200] [--threads 2]
                                              [--path fp32|avx512_bf16|both] [--cases all|few-long]

Prints the best of `repeat` runs of `calls` calls per case, in us of the calling
thread's CPU time per call (the kernel runs in the calling thread at these sizes: on a
shared machine, time spent waiting for a core is left out; the minimum is the least
disturbed by other processes' use of the caches), including the Python wrapper (~30 us
on a slow host, which a graph replay does not pay). With --baseline, another version of
the C file (e.g. `git show main:...` saved to a file) is built as a second library and
timed in the same run, alternating case by case, with the largest difference between
the two outputs.

Then few long sequences (1 and 2 of 4K-32K positions, 9/3 and 16/4 query/kv heads: the
split over positions' cases), in ms of wall time per call, the best of many runs of two
calls, side by side with --baseline; `--cases few-long` prints only those.

Then, for long contexts, the kernel's KV read rate in GB/s of wall time at `--threads`,
against the copy bandwidth torch reaches on the same threads (bytes read plus bytes
written by `Tensor.copy_` over 512 MiB): issue 36's target is 85% of it. Each context
length comes with as many sequences as make the bf16 KV at least LONG_CACHE_FACTOR times
the last-level cache (read from sysfs), so that the calls read memory, not a cache that
holds the KV from the call before. A bf16 cache comes with a bf16 query (as the cpu
backend's bf16 models call it), so that the AVX512-BF16 path can take it; `--path`
times the kernel's fp32-lanes path, its AVX512-BF16 path or both side by side on the
long contexts (default: the path the host picks), and `--baseline` times its library
there too, alternating with this one.
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path
from typing import Any, Callable

import torch

from accord.backends.cpu.kernels import _native, _native_attention

Q_HEADS, KV_HEADS, HEAD_DIM, BLOCK_SIZE = 16, 4, 64, 16
#: The long contexts' lengths: from many sequences of a thousand positions to one long one.
LONG_POSITIONS = (1024, 4096, 16384, 131072)
#: How many times the last-level cache a long context's bf16 KV is at least.
LONG_CACHE_FACTOR = 4
#: Few long sequences (issue 36's split over positions): 1 and 2 sequences of these
#: lengths, at SmolLM2-135M's heads (9 query, 3 kv) and the bench model's (16, 4).
FEW_POSITIONS = (4096, 16384, 32768)
FEW_HEADS = ((9, 3), (16, 4))


def _case(
    seqs: int, positions: int, dtype: torch.dtype, q_heads: int = Q_HEADS, kv_heads: int = KV_HEADS
) -> tuple[Any, ...]:
    """attend_decodes' arguments for `seqs` decode rows of `positions` each."""
    blocks = -(-positions // BLOCK_SIZE)
    caches = [torch.randn(seqs * blocks, BLOCK_SIZE, kv_heads, HEAD_DIM).to(dtype) for _ in range(2)]
    tables = torch.randperm(seqs * blocks, dtype=torch.int32).reshape(seqs, blocks)
    query = torch.randn(seqs, q_heads, HEAD_DIM).to(dtype)
    out = torch.empty(seqs, q_heads, HEAD_DIM, dtype=dtype)
    seq_lens = torch.full((seqs,), positions, dtype=torch.int32)
    query_start_loc = torch.arange(seqs + 1, dtype=torch.int32)
    return query, *caches, tables, seq_lens, query_start_loc, HEAD_DIM**-0.5, 0, out


def _time(
    args: tuple[Any, ...], repeat: int, calls: int, clock: Callable[[], float] = time.thread_time,
    isa: _native_attention.Isa | None = None,
) -> float:
    """Best of `repeat` runs, in seconds per call of `clock`: this thread's CPU time by
    default; wall time (`time.perf_counter`) on long contexts, whose calls run the
    kernel's threads beside the calling one."""
    best = float("inf")
    for _ in range(repeat):
        start = clock()
        for _ in range(calls):
            _native_attention.attend_decodes(*args, isa=isa)
        best = min(best, (clock() - start) / calls)
    return best


def _copy_bandwidth(repeat: int) -> float:
    """Best GB/s (read plus written) of torch copying 512 MiB on this process's threads."""
    source = torch.ones(2**27)
    target = torch.empty_like(source)
    target.copy_(source)  # warm-up: the first copy also faults the target's pages in
    best = float("inf")
    for _ in range(repeat):
        start = time.perf_counter()
        target.copy_(source)
        best = min(best, time.perf_counter() - start)
    return 2 * source.numel() * source.element_size() / best / 1e9


def _last_level_cache_bytes() -> int:
    """The largest cache sysfs lists for cpu0, in bytes (32 MiB where it lists none)."""
    sizes = []
    for entry in Path("/sys/devices/system/cpu/cpu0/cache").glob("index*/size"):
        text = entry.read_text().strip()
        units = {"K": 2**10, "M": 2**20, "G": 2**30}
        sizes.append(int(text[:-1]) * units[text[-1]] if text[-1] in units else int(text))
    return max(sizes, default=32 * 2**20)


def _long_contexts(
    repeat: int, paths: dict[str, _native_attention.Isa | None], libraries: dict[str, Any]
) -> None:
    """Print the kernel's KV read rate on long contexts against the copy bandwidth, per
    path and library (alternating path by path and library by library within each case)."""
    copy, llc = _copy_bandwidth(repeat), _last_level_cache_bytes()
    print(f"\nlong contexts, wall time on {torch.get_num_threads()} threads; copy bandwidth {copy:.1f} GB/s; "
          f"last-level cache {llc / 2**20:.0f} MiB")
    print(f"{'seqs':>4} {'pos':>6} {'cache':>8} {'path':>12} {'library':>8} {'KV MB':>7} {'ms':>8} {'GB/s':>6} "
          f"{'of copy':>7}")
    current = _native_attention._library
    for dtype in (torch.bfloat16, torch.float32):
        for positions in LONG_POSITIONS:
            seqs = -(-LONG_CACHE_FACTOR * llc // (2 * positions * KV_HEADS * HEAD_DIM * 2))
            args = _case(seqs, positions, dtype)
            kv_bytes = 2 * seqs * positions * KV_HEADS * HEAD_DIM * args[1].element_size()
            for name, isa in paths.items():
                for label, library in libraries.items():
                    _native_attention._library = lambda library=library: library
                    _time(args, 1, 2, time.perf_counter, isa)  # warm-up
                    seconds = _time(args, repeat, 5, time.perf_counter, isa)
                    rate = kv_bytes / seconds / 1e9
                    print(f"{seqs:>4} {positions:>6} {str(dtype)[6:]:>8} {name:>12} {label:>8} {kv_bytes / 1e6:7.1f} "
                          f"{seconds * 1e3:8.2f} {rate:6.1f} {rate / copy:7.0%}", flush=True)
            _native_attention._library = current
            del args


def _few_long_sequences(repeat: int, libraries: dict[str, Any]) -> None:
    """Print wall time per call on 1 and 2 long sequences, per library (alternating),
    on the host's path: where a step has fewer sequences than threads, or kv heads that
    do not divide among them, only a split over positions keeps every thread busy."""
    print(f"\nfew long sequences, wall time on {torch.get_num_threads()} threads")
    print(f"{'seqs':>4} {'pos':>6} {'heads':>6} {'cache':>8} " + " ".join(f"{name + ' ms':>12}" for name in libraries)
          + ("  speedup" if len(libraries) > 1 else ""))
    current = _native_attention._library
    for dtype in (torch.bfloat16, torch.float32):
        for q_heads, kv_heads in FEW_HEADS:
            for seqs in (1, 2):
                for positions in FEW_POSITIONS:
                    args = _case(seqs, positions, dtype, q_heads, kv_heads)
                    times = {}
                    for name, library in libraries.items():
                        _native_attention._library = lambda library=library: library
                        _time(args, 1, 3, time.perf_counter)  # warm-up
                        # Short runs: a thread descheduled by another process (a tick,
                        # ~4 ms) stalls the whole call, so many runs give one left alone.
                        times[name] = _time(args, 4 * repeat, 2, time.perf_counter) * 1e3
                    row = (f"{seqs:>4} {positions:>6} {q_heads:>3}/{kv_heads:<2} {str(dtype)[6:]:>8} "
                           + " ".join(f"{t:12.3f}" for t in times.values()))
                    if "baseline" in times:
                        row += f"  {times['baseline'] / times['this']:6.2f}x"
                    print(row, flush=True)
    _native_attention._library = current


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--baseline", help="another paged_decode_attention.c to time side by side")
    parser.add_argument("--repeat", type=int, default=7)
    parser.add_argument("--calls", type=int, default=200)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--path", choices=("host", "fp32", "avx512_bf16", "both"), default="host",
                        help="the kernel path(s) timed on long contexts")
    parser.add_argument("--cases", choices=("all", "few-long"), default="all",
                        help="every table, or only the few long sequences")
    opts = parser.parse_args()
    isas = {"fp32": _native_attention.Isa.FP32, "avx512_bf16": _native_attention.Isa.AVX512_BF16}
    paths = {"host": None} if opts.path == "host" else isas if opts.path == "both" else {opts.path: isas[opts.path]}
    torch.manual_seed(0)
    torch.set_num_threads(opts.threads)
    current = _native_attention._library()
    libraries = {"this": current}
    if opts.baseline:
        libraries["baseline"] = _native.load(opts.baseline, *_native_attention.LIBRARY[1:])
    if opts.cases == "few-long":
        _few_long_sequences(opts.repeat, libraries)
        return
    header = f"{'seqs':>4} {'pos':>4} {'cache':>8} " + " ".join(f"{name + ' us':>12}" for name in libraries)
    print(header + ("  speedup  max|diff|" if opts.baseline else ""))
    for dtype in (torch.bfloat16, torch.float32):
        for seqs in (1, 4):
            for positions in (64, 192, 512):
                args = _case(seqs, positions, dtype)
                times, outs = {}, {}
                for name, library in libraries.items():
                    # The benchmark swaps which built library the wrapper calls.
                    _native_attention._library = lambda library=library: library
                    _time(args, 1, opts.calls)  # warm-up
                    times[name] = _time(args, opts.repeat, opts.calls) * 1e6
                    outs[name] = args[-1].clone()
                _native_attention._library = lambda: current
                row = f"{seqs:>4} {positions:>4} {str(dtype)[6:]:>8} " + " ".join(f"{t:12.1f}" for t in times.values())
                if opts.baseline:
                    diff = (outs["this"] - outs["baseline"]).abs().max().item()
                    row += f"  {times['baseline'] / times['this']:6.2f}x  {diff:.2e}"
                print(row, flush=True)
    _few_long_sequences(opts.repeat, libraries)
    _long_contexts(opts.repeat, paths, libraries)


if __name__ == "__main__":
    main()
