"""Per-op micro-benchmark of the cpu backend against the reference, on decode- and
prefill-like shapes of a small GQA model (16 query / 4 kv heads of 64, hidden 1024,
vocab 8192, block size 16).

    python benchmarks/ops_cpu.py [--ops paged_attention,sample] [--no-reference] [--repeat 5] [--threads 2]

Prints one row per case: the best of `repeat` calls of each backend (the minimum is
the least disturbed by other processes on a shared machine) and the speedup.
"""

from __future__ import annotations

import argparse
import time
from dataclasses import dataclass
from typing import Any, Callable

import torch
import torch.nn.functional as F

from accord.backends import get_backend
from accord.op_contracts import OpDispatcher

HIDDEN, INTERMEDIATE, Q_HEADS, KV_HEADS, HEAD_DIM = 1024, 2816, 16, 4, 64
VOCAB, BLOCK_SIZE = 8192, 16

#: One call's arguments: positional and keyword.
Call = tuple[tuple[Any, ...], dict[str, Any]]


@dataclass(frozen=True)
class Case:
    """One benchmarked call: an op, a label for its shape, and a builder of its args."""

    op: str
    label: str
    build: Callable[[], Call]


def _paged(lengths: list[tuple[int, int]]) -> Call:
    """A paged_attention call over (context length, new rows) per sequence, with the
    sequences' blocks scattered over the cache."""
    counts = [-(-n // BLOCK_SIZE) for n, _ in lengths]
    physical = torch.randperm(sum(counts))
    block_tables = torch.zeros(len(lengths), max(counts), dtype=torch.int32)
    used = 0
    for b, count in enumerate(counts):
        block_tables[b, :count] = physical[used : used + count]
        used += count
    caches = [torch.randn(len(physical), BLOCK_SIZE, KV_HEADS, HEAD_DIM) for _ in range(2)]
    query_lens = torch.tensor([q for _, q in lengths])
    query_start_loc = F.pad(query_lens.cumsum(0), (1, 0)).to(torch.int32)
    seq_lens = torch.tensor([n for n, _ in lengths], dtype=torch.int32)
    query = torch.randn(int(query_lens.sum()), Q_HEADS, HEAD_DIM)
    return (query, *caches, block_tables, seq_lens, query_start_loc), {"scale": HEAD_DIM**-0.5}


def _sample(rows: int, temperature: float, top_p: float, sharpness: float = 1.0) -> Call:
    """A sample call; `sharpness` scales N(0, 1) logits (LLM logits are peaked, ~4)."""
    return (
        torch.randn(rows, VOCAB) * sharpness,
        torch.full((rows,), temperature),
        torch.zeros(rows, dtype=torch.int32),
        torch.full((rows,), top_p),
        torch.zeros(rows),
        torch.arange(rows, dtype=torch.int64),
    ), {"num_logprobs": 5}


def _fused_moe(tokens: int, experts: int = 8, top_k: int = 2, intermediate: int = 704) -> Call:
    ids = torch.stack([torch.randperm(experts)[:top_k] for _ in range(tokens)]).to(torch.int32)
    return (
        torch.randn(tokens, HIDDEN),
        torch.randn(experts, 2 * intermediate, HIDDEN) / 32,
        torch.randn(experts, HIDDEN, intermediate) / 32,
        torch.rand(tokens, top_k),
        ids,
    ), {}


def _norm(tokens: int, residual: bool = False) -> Call:
    """An rms_norm call, or a fused_add_rms_norm one with `residual`."""
    rows = (torch.randn(tokens, HIDDEN), torch.randn(tokens, HIDDEN)) if residual else (torch.randn(tokens, HIDDEN),)
    return (*rows, torch.randn(HIDDEN)), {}


def _rotary(tokens: int) -> Call:
    return (
        torch.randint(0, 4096, (tokens,)),
        torch.randn(tokens, Q_HEADS, HEAD_DIM),
        torch.randn(tokens, KV_HEADS, HEAD_DIM),
        torch.randn(4096, HEAD_DIM),
    ), {}


def _cache_write(tokens: int) -> Call:
    blocks = 4096
    caches = [torch.zeros(blocks, BLOCK_SIZE, KV_HEADS, HEAD_DIM) for _ in range(2)]
    slots = torch.randperm(blocks * BLOCK_SIZE)[:tokens]
    return (torch.randn(tokens, KV_HEADS, HEAD_DIM), torch.randn(tokens, KV_HEADS, HEAD_DIM), *caches, slots), {}


def _scaled_mm(mode: str, rows: int = 128) -> Call:
    fp8 = torch.float8_e4m3fn
    scales = {"tensor": ((1, 1), (1, 1)), "block": ((rows, HIDDEN // 128), (HIDDEN // 128, HIDDEN // 128))}[mode]
    a, b = torch.randn(rows, HIDDEN).to(fp8), torch.randn(HIDDEN, HIDDEN).to(fp8)
    return (a, b, torch.rand(scales[0]), torch.rand(scales[1])), {"scale_mode": mode, "out_dtype": torch.float32}


def cases() -> list[Case]:
    """The benchmarked calls: decodes of 1 and 128 sequences, 512-token prefill chunks."""
    decode, prefill = 128, 512
    return [
        Case("paged_attention", "decode 1 seq x ctx 192", lambda: _paged([(192, 1)])),
        Case("paged_attention", "decode 128 seqs x ctx 800", lambda: _paged([(800, 1)] * decode)),
        Case("paged_attention", "decode 128 seqs x ctx 50..800", lambda: _paged([(50 + 6 * i, 1) for i in range(128)])),
        Case("paged_attention", "prefill 1 x 512", lambda: _paged([(prefill, prefill)])),
        Case("paged_attention", "chunk 512 of ctx 800 + 64 decodes", lambda: _paged([(800, 512)] + [(400, 1)] * 64)),
        Case("reshape_and_cache", f"{decode} tokens", lambda: _cache_write(decode)),
        Case("reshape_and_cache", f"{prefill} tokens", lambda: _cache_write(prefill)),
        Case("rms_norm", f"{decode} x {HIDDEN}", lambda: _norm(decode)),
        Case("rms_norm", f"{prefill} x {HIDDEN}", lambda: _norm(prefill)),
        Case("fused_add_rms_norm", f"{decode} x {HIDDEN}", lambda: _norm(decode, residual=True)),
        Case("fused_add_rms_norm", f"{prefill} x {HIDDEN}", lambda: _norm(prefill, residual=True)),
        Case("rotary_embedding", f"{decode} tokens", lambda: _rotary(decode)),
        Case("rotary_embedding", f"{prefill} tokens", lambda: _rotary(prefill)),
        Case("silu_and_mul", f"{decode} x 2*{INTERMEDIATE}", lambda: ((torch.randn(decode, 2 * INTERMEDIATE),), {})),
        Case("silu_and_mul", f"{prefill} x 2*{INTERMEDIATE}", lambda: ((torch.randn(prefill, 2 * INTERMEDIATE),), {})),
        Case("sample", f"{decode} greedy x {VOCAB}", lambda: _sample(decode, 0.0, 1.0)),
        Case("sample", f"{decode} top_p 0.9 x {VOCAB} peaked", lambda: _sample(decode, 0.8, 0.9, sharpness=4.0)),
        Case("sample", f"{decode} top_p 0.9 x {VOCAB} flat", lambda: _sample(decode, 0.8, 0.9)),
        Case("moe_route", f"{decode} tokens x 64 experts top 6", lambda: ((torch.randn(decode, 64),), {"top_k": 6})),
        Case("fused_moe", f"{decode} tokens, 8 experts top 2", lambda: _fused_moe(decode)),
        Case("quantize_fp8", f"{decode} x {HIDDEN} per token", lambda: ((torch.randn(decode, HIDDEN),), {})),
        Case("scaled_mm", f"{decode} x {HIDDEN} x {HIDDEN} tensor", lambda: _scaled_mm("tensor")),
        Case("scaled_mm", f"{decode} x {HIDDEN} x {HIDDEN} block", lambda: _scaled_mm("block")),
    ]


def best_ms(ops: OpDispatcher, case: Case, args: tuple[Any, ...], kwargs: dict[str, Any], repeat: int) -> float:
    """Shortest wall time of `repeat` calls after one warm-up call."""
    call = getattr(ops, case.op)
    call(*args, **kwargs)
    times = []
    for _ in range(repeat):
        start = time.perf_counter()
        call(*args, **kwargs)
        times.append(time.perf_counter() - start)
    return min(times) * 1e3


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--ops", help="comma-separated op names (default: all)")
    parser.add_argument("--no-reference", action="store_true", help="time the cpu backend only")
    parser.add_argument("--repeat", type=int, default=5)
    parser.add_argument("--threads", type=int, help="torch intra-op threads (default: torch's)")
    options = parser.parse_args()
    if options.threads:
        torch.set_num_threads(options.threads)
    wanted = set(options.ops.split(",")) if options.ops else None
    cpu = OpDispatcher(get_backend("cpu"), strict=False)
    reference = OpDispatcher(get_backend("reference"), strict=False)
    torch.manual_seed(0)
    print(f"{'op':<20} {'shape':<38} {'cpu ms':>9} {'ref ms':>9} {'speedup':>8}   (threads={torch.get_num_threads()})")
    for case in cases():
        if wanted is not None and case.op not in wanted:
            continue
        args, kwargs = case.build()
        cpu_ms = best_ms(cpu, case, args, kwargs, options.repeat)
        if options.no_reference:
            print(f"{case.op:<20} {case.label:<38} {cpu_ms:>9.3f}")
            continue
        ref_ms = best_ms(reference, case, args, kwargs, max(1, options.repeat // 3))
        print(f"{case.op:<20} {case.label:<38} {cpu_ms:>9.3f} {ref_ms:>9.3f} {ref_ms / cpu_ms:>7.1f}x")


if __name__ == "__main__":
    main()
