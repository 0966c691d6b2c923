"""The cpu `lora_linear` paths against the base GEMM they ride on, on the projections of
SmolLM2-135M's shape (hidden 576, 9/3 heads of 64, intermediate 1536; qkv and gate_up
fused, so their slots stack 3 and 2 ranks), 16 slots of rank 16.

    PYTHONPATH=. python benchmarks/lora_kernel_cpu.py [--tokens 32 512] [--adapters 1 4 16] [--repeat 30]

Per projection, token count, dtype and number of distinct adapters in the batch (the
tokens dealt round-robin over them): the median of `repeat` rounds of
- `linear`: the cpu backend's `linear` on the weight `prepare_linear_weight` makes of it
  (what the engine runs for the base projection),
- `bgmv`: the native kernel (lora_linear.c: one shrink and one expand over every token),
- `grouped`: the torch path (two fp32 GEMMs per slot the batch uses, the kernel of the
  previous session),
the three called in turn within each round (so a busy host disturbs them alike), in
microseconds, and lora / linear.
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch

from accord.backends.cpu import CpuBackend
from accord.backends.cpu.kernels import _native_lora, lora
from accord.backends.cpu.kernels.linear import linear

#: (name, N, K, stacked slices) of each projection.
SHAPES = (("qkv", 960, 576, 3), ("o_proj", 576, 576, 1), ("gate_up", 3072, 576, 2), ("down", 576, 1536, 1))


def rounds(calls: dict[str, callable], repeat: int) -> dict[str, float]:
    """Median microseconds of each call, the calls alternating within each round."""
    for call in calls.values():
        call(), call()
    times: dict[str, list[float]] = {name: [] for name in calls}
    for _ in range(repeat):
        for name, call in calls.items():
            start = time.perf_counter()
            call()
            times[name].append(time.perf_counter() - start)
    return {name: statistics.median(values) * 1e6 for name, values in times.items()}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--tokens", type=int, nargs="+", default=[32, 512])
    parser.add_argument("--adapters", type=int, nargs="+", default=[1, 4, 16])
    parser.add_argument("--dtypes", nargs="+", default=["bfloat16", "float32"])
    parser.add_argument("--slots", type=int, default=16)
    parser.add_argument("--rank", type=int, default=16)
    parser.add_argument("--repeat", type=int, default=30)
    parser.add_argument("--threads", type=int, default=None)
    args = parser.parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)
    backend = CpuBackend()
    print(f"{torch.get_num_threads()} thread(s); native paths {_native_lora.compiled_paths()}; median of {args.repeat}")
    print(f"{'proj':>8} {'dtype':>8} {'T':>5} {'adapters':>8} {'linear':>9} {'bgmv':>9} {'grouped':>9} "
          f"{'bgmv/lin':>8} {'grp/lin':>8}")
    for dtype_name in args.dtypes:
        dtype = getattr(torch, dtype_name)
        for name, n, k, stacked in SHAPES:
            r = stacked * args.rank
            weight = backend.prepare_linear_weight((torch.randn(n, k) * 0.02).to(dtype))
            lora_a = (torch.randn(args.slots, r, k) * k**-0.5).to(dtype)
            lora_b = (torch.randn(args.slots, r, n) * 0.01).to(dtype)
            for tokens in args.tokens:
                x = torch.randn(tokens, k).to(dtype)
                y, out = torch.empty(tokens, n, dtype=dtype), torch.empty(tokens, n, dtype=dtype)
                for adapters in args.adapters:
                    slot_ids = (torch.arange(tokens) % adapters).to(torch.int32)
                    medians = rounds({
                        "linear": lambda: linear(x, weight, None, None, y),
                        "bgmv": lambda: _native_lora.lora_linear(y, x, lora_a, lora_b, slot_ids, out),
                        "grouped": lambda: lora.grouped_lora_linear(y, x, lora_a, lora_b, slot_ids, out),
                    }, args.repeat)
                    base = medians["linear"]
                    print(f"{name:>8} {dtype_name[:8]:>8} {tokens:>5} {adapters:>8} {base:9.0f} {medians['bgmv']:9.0f} "
                          f"{medians['grouped']:9.0f} {medians['bgmv'] / base:8.2f} {medians['grouped'] / base:8.2f}",
                          flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
