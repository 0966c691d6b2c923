"""Host cost of a contract call: the dispatcher's fast path (a handle bound at the call
site, a signature it has seen, positional or with parameters by name) against calling
the kernel directly, the full path (bind + signature lookup, what every call paid
before the fast path) and strict mode.

    PYTHONPATH=. python benchmarks/dispatch_overhead.py [--calls 20000]

Times are CPU time of this process (`time.process_time`), so other load on a shared
machine inflates them less than wall time would; the columns are measured interleaved
in one run, and the overhead column is what the dispatcher adds to kernel + allocation.
"""

from __future__ import annotations

import argparse
import time
from typing import Any, Callable

import torch

from accord.backends import get_backend
from accord.op_contracts import CONTRACTS, OpDispatcher


def per_call_us(fn: Callable[[], Any], calls: int) -> float:
    """Best-of-5 CPU microseconds per call of `fn`."""
    fn()
    best = float("inf")
    for _ in range(5):
        start = time.process_time()
        for _ in range(calls):
            fn()
        best = min(best, time.process_time() - start)
    return best / calls * 1e6


def cases() -> dict[str, tuple[str, tuple[Any, ...], dict[str, Any], dict[str, tuple[int, ...]]]]:
    """Per row: the op, decode-sized arguments (one token; positional, then by name as
    the model layers pass parameters) and its output shapes."""
    hidden = 64
    weight = get_backend("cpu").prepare_linear_weight(torch.randn(96, hidden))
    x, norm_weight = torch.randn(1, hidden), torch.randn(hidden)
    return {
        "rms_norm": ("rms_norm", (x, norm_weight, 1e-6), {}, {"out": (1, hidden)}),
        "rms_norm eps=": ("rms_norm", (x, norm_weight), {"eps": 1e-6}, {"out": (1, hidden)}),
        "linear": ("linear", (x, weight, None), {}, {"out": (1, 96)}),
        "silu_and_mul": ("silu_and_mul", (torch.randn(1, 2 * hidden),), {}, {"out": (1, hidden)}),
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--calls", type=int, default=20000)
    args = parser.parse_args(argv)
    backend = get_backend("cpu")
    fast, strict = OpDispatcher(backend, strict=False), OpDispatcher(backend, strict=True)
    print(f"{'call':<15}{'kernel+alloc':>13}{'fast path':>12}{'overhead':>10}{'full path':>11}{'strict':>9}  (us/call)")
    for row, (op, positional, keywords, outputs) in cases().items():
        contract = CONTRACTS[op]
        kernel = backend.kernel_for(op).fn  # type: ignore[union-attr]
        bound = fast.bind(contract, positional, keywords)
        dtype = positional[0].dtype

        def direct() -> None:
            kernel(**bound, **{name: torch.empty(shape, dtype=dtype) for name, shape in outputs.items()})

        handle, strict_handle = getattr(fast, op), getattr(strict, op)
        direct_us = per_call_us(direct, args.calls)
        fast_us = per_call_us(lambda: handle(*positional, **keywords), args.calls)
        full_us = per_call_us(lambda: fast.call(contract, positional, keywords), args.calls)
        strict_us = per_call_us(lambda: strict_handle(*positional, **keywords), args.calls // 4)
        print(f"{row:<15}{direct_us:>13.2f}{fast_us:>12.2f}{fast_us - direct_us:>10.2f}{full_us:>11.2f}{strict_us:>9.2f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
