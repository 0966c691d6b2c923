"""Per-call host cost of a native cpu kernel entry point, by binding: the ctypes call
the kernels make today through `_native.NativeFunction` (a Python wrapper that lets a
graph capture record the call), the bare ctypes function it wraps, and the same
symbol bound through cffi's ABI mode (`cffi.FFI().cdef` + `dlopen`), measured on
`accord_copy_rows` with zero rows (5 arguments, no work).

    PYTHONPATH=. python benchmarks/native_call_overhead.py [--calls 200000]

Best of 5 wall-clock runs (`timeit`), microseconds per call.
"""

from __future__ import annotations

import argparse
import timeit
from pathlib import Path

import torch


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--calls", type=int, default=200000)
    args = parser.parse_args(argv)
    import cffi

    from accord.backends.cpu.kernels import _native_elementwise

    library = _native_elementwise._library()
    if library is None:
        print("the native elementwise library does not build here (no C compiler?)")
        return 1
    wrapped = library.accord_copy_rows
    src, out = torch.zeros(4, 8), torch.empty(4, 8)
    a, b = src.data_ptr(), out.data_ptr()
    path = next(line.split()[-1] for line in Path("/proc/self/maps").read_text().splitlines()
                if "/elementwise-" in line)
    ffi = cffi.FFI()
    ffi.cdef("void accord_copy_rows(intptr_t src, intptr_t out, long rows, long row_bytes, long stride);")
    by_cffi = ffi.dlopen(path)
    bare = wrapped._entry
    calls = {
        "ctypes, NativeFunction": lambda: wrapped(a, b, 0, 32, 32),
        "ctypes, bare": lambda: bare(a, b, 0, 32, 32),
        "cffi ABI mode": lambda: by_cffi.accord_copy_rows(a, b, 0, 32, 32),
    }
    for name, call in calls.items():
        best = min(timeit.repeat(call, number=args.calls, repeat=5)) / args.calls * 1e6
        print(f"{name:<24}{best:8.3f} us/call")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
