"""The bf16-weight GEMM of bf16_weight_gemm.c: built once per host with the system C
compiler, cached, called through ctypes (with the one-pass bf16 copy the load makes).

Plain C with no torch headers builds in about a second (a torch C++ extension takes tens
of seconds), so even a cold start-up stays short; `-march=native` makes it the host's
vector code, so the cache key holds the compiler, its flags and the CPU's flags, and a
cache shared between different hosts never serves one the other's build. Without a C
compiler (or when the build fails) `available()` is False and callers keep the fp32 path.
"""

from __future__ import annotations

import ctypes
import hashlib
import logging
import os
import shutil
import subprocess
import tempfile
from functools import cache
from pathlib import Path
import torch

logger = logging.getLogger(__name__)

SOURCE = Path(__file__).with_name("bf16_weight_gemm.c")
FLAGS = ("-O3", "-march=native", "-fopenmp", "-shared", "-fPIC")

def _cache_dir() -> Path:
    """Where built libraries are kept (one per source, compiler and host ISA)."""
    base = os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache"
    return Path(base) / "accord" / "kernels"


def _cpu_flags() -> str:
    try:
        with open("/proc/cpuinfo") as cpuinfo:
            for line in cpuinfo:
                if line.startswith(("flags", "Features")):
                    return line
    except OSError:
        pass
    return ""


def _build(compiler: str) -> Path:
    version = subprocess.run([compiler, "--version"], capture_output=True, text=True, check=True).stdout
    key = hashlib.sha256("\0".join([SOURCE.read_text(), " ".join(FLAGS), version, _cpu_flags()]).encode())
    library = _cache_dir() / f"bf16_weight_gemm-{key.hexdigest()[:16]}.so"
    if library.is_file():
        return library
    library.parent.mkdir(parents=True, exist_ok=True)
    # Build beside the target and rename: concurrent start-ups never load a half-written file.
    with tempfile.TemporaryDirectory(dir=library.parent) as scratch:
        built = Path(scratch) / library.name
        subprocess.run([compiler, *FLAGS, "-o", str(built), str(SOURCE)], capture_output=True, text=True, check=True)
        os.replace(built, library)
    return library


@cache
def _library() -> ctypes.CDLL | None:
    """The built library with its entry points typed; None where it cannot be built."""
    compiler = os.environ.get("CC") or shutil.which("gcc") or shutil.which("cc")
    if compiler is None:
        logger.info("no C compiler found: bf16 weights are computed through the fp32 path")
        return None
    try:
        library = ctypes.CDLL(str(_build(compiler)))
    except (OSError, subprocess.CalledProcessError) as error:
        detail = getattr(error, "stderr", "") or error
        logger.warning("building the bf16-weight GEMM failed, using the fp32 path: %s", detail)
        return None
    library.accord_bf16_weight_gemm.restype = None
    library.accord_bf16_weight_gemm.argtypes = [ctypes.c_void_p] * 4 + [ctypes.c_long] * 5 + [ctypes.c_int]
    library.accord_exact_bf16.restype = ctypes.c_int
    library.accord_exact_bf16.argtypes = [ctypes.c_void_p, ctypes.c_void_p, ctypes.c_long, ctypes.c_int]
    return library


def available() -> bool:
    """Whether the library is built (or can be) on this host."""
    return _library() is not None


def gemm(x: torch.Tensor, w: torch.Tensor, bias: torch.Tensor | None, out: torch.Tensor) -> None:
    """out [M, N] fp32 = x [M, K] fp32 @ w [N, K] bf16 ^T (+ bias fp32), fp32 accumulation,
    on torch's thread count. x and out need unit column strides, w and bias contiguity;
    only when `available()`."""
    m, k = x.shape
    _library().accord_bf16_weight_gemm(  # type: ignore[union-attr]
        x.data_ptr(), w.data_ptr(), None if bias is None else bias.data_ptr(), out.data_ptr(),
        m, w.shape[0], k, x.stride(0), out.stride(0), torch.get_num_threads(),
    )


def exact_bf16(weight: torch.Tensor) -> torch.Tensor | None:
    """A contiguous fp32 tensor's values as bf16 when they are all exactly bf16 (one
    pass, no temporaries), else None; only when `available()`."""
    copy = torch.empty(weight.shape, dtype=torch.bfloat16)
    exact = _library().accord_exact_bf16(  # type: ignore[union-attr]
        weight.data_ptr(), copy.data_ptr(), weight.numel(), torch.get_num_threads()
    )
    return copy if exact else None
