"""The cpu `linear` paths side by side, on the projections of the 152M benchmark Llama
(hidden 1024, intermediate 2816, GQA 16/4 of 64, vocab 8192; qkv and gate_up fused).

    python benchmarks/linear_cpu.py [--rows 1,2,4,8,32,128] [--repeat 20] [--threads 2]

Per shape and row count, the best of `repeat` calls (the least disturbed on a shared
machine) of each path, in microseconds, and the weight bytes streamed per microsecond
(GB/s, in the bytes of its weight form) of the fastest one:
- `fp32 F.linear`: torch's GEMM on a plain fp32 [N, K] weight;
- `fp32 oneDNN`: oneDNN on the weight prepacked in its blocked layout (what the cpu
  backend held before bf16 weights);
- `bf16w native`: the bf16-weight GEMM (fp32 activations and accumulation) on the bf16
  weight, what the cpu backend runs for few rows on a bf16 checkpoint without native bf16;
- `bf16w bf16 x`: the same GEMM on bf16 activations, rounded once to bf16 out: what it
  runs for few rows where the CPU computes bf16 natively (AVX512-BF16 or AMX);
- `bf16 oneDNN`: oneDNN's bf16 GEMM on bf16 activations (rounds x to bf16, so it is no
  candidate on a host computing in fp32; shown as the speed a native-bf16 host gets);
- `backend`: the cpu backend's `linear` kernel on the form `prepare_linear_weight`
  gives the checkpoint's bf16 weight in the dtype this host computes it in (an
  exactly-bf16 fp32 weight, or the bf16 one on a native-bf16 host), i.e. the path the
  engine takes.
"""

from __future__ import annotations

import argparse
import time
from typing import Callable

import torch

from accord.backends.cpu import CpuBackend
from accord.backends.cpu.kernels import linear as cpu_linear
from accord.backends.cpu.kernels import _native_gemm
from accord.backends.cpu.kernels._precision import work_dtype

#: (name, N, K) of each projection.
SHAPES = (("qkv", 1536, 1024), ("o", 1024, 1024), ("gate_up", 5632, 1024), ("down", 1024, 2816), ("lm_head", 8192, 1024))


def best_us(fn: Callable[[], object], repeat: int) -> float:
    """The fastest of `repeat` calls after two warm-ups, in microseconds."""
    fn()
    fn()
    times = []
    for _ in range(repeat):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return min(times) * 1e6


def paths(rows: int, n: int, k: int) -> tuple[dict[str, Callable[[], object]], int]:
    """Each path's call on random data, and the weight's element count."""
    weight = (torch.randn(n, k) * 0.02).to(torch.bfloat16)
    w32 = weight.float()
    x = torch.randn(rows, k)
    out = torch.empty(rows, n)
    packed32 = torch.ops.mkldnn._reorder_linear_weight(w32)
    packed16 = torch.ops.mkldnn._reorder_linear_weight(weight)
    x16, out16 = x.to(torch.bfloat16), out.to(torch.bfloat16)
    compute = work_dtype(torch.bfloat16)
    prepared = CpuBackend().prepare_linear_weight(weight.to(compute))
    x_backend, out_backend = (x, out) if compute == torch.float32 else (x16, out16)
    calls: dict[str, Callable[[], object]] = {
        "fp32 F.linear": lambda: torch.mm(x, w32.t(), out=out),
        "fp32 oneDNN": lambda: torch.ops.mkldnn._linear_pointwise(x, packed32, None, "none", [], ""),
    }
    if _native_gemm.available():
        streamed = _native_gemm.bf16_weight(weight)
        calls["bf16w native"] = lambda: streamed(x, None, out)
        calls["bf16w bf16 x"] = lambda: streamed(x16, None, out16)
    calls["bf16 oneDNN"] = lambda: torch.ops.mkldnn._linear_pointwise(x16, packed16, None, "none", [], "")
    calls["backend"] = lambda: cpu_linear.linear(x_backend, prepared, None, out_backend)
    return calls, weight.numel()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rows", default="1,2,4,8,32,128")
    parser.add_argument("--repeat", type=int, default=20)
    parser.add_argument("--threads", type=int, default=2)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    torch.manual_seed(0)
    header = None
    for name, n, k in SHAPES:
        for rows in (int(r) for r in args.rows.split(",")):
            calls, numel = paths(rows, n, k)
            if header is None:
                header = f"{'shape':>8} {'N x K':>12} {'rows':>4} " + " ".join(f"{p:>13}" for p in calls)
                print(f"{args.threads} threads; us per call (best of {args.repeat}); weight GB/s of the best (in the bytes of its own weight form)")
                print(header + f" {'best':>13} {'GB/s':>6}")
            times = {path: best_us(call, args.repeat) for path, call in calls.items()}
            fastest = min((p for p in times if p != "backend"), key=times.get)
            cells = " ".join(f"{times[p]:13.0f}" for p in calls)
            streamed = numel * (4 if fastest.startswith("fp32") else 2)
            print(f"{name:>8} {f'{n}x{k}':>12} {rows:>4} {cells} {fastest:>13} {streamed / times[fastest] / 1e3:6.1f}")


if __name__ == "__main__":
    main()
