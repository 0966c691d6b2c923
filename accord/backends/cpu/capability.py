"""What the host CPU computes natively: the check that picks the cpu kernels' compute
dtype (a module of its own, so the kernels read it without importing the backend)."""

from __future__ import annotations

import os
import shutil
from functools import cache


#: Overrides the CPU check: `native` forces the bf16 compute path (emulated, slowly,
#: where the CPU lacks the instructions: what tests use to exercise it on any host),
#: `fp32` forces the fp32 path; unset or `auto` asks the CPU.
BF16_PATH_VARIABLE = "ACCORD_CPU_BF16_PATH"


@cache
def cpu_has_native_bf16() -> bool:
    """Whether this CPU has bf16 matrix instructions (AVX512-BF16 or AMX); without
    them torch's bf16 GEMMs are emulated and orders of magnitude slower than fp32.
    `ACCORD_CPU_BF16_PATH` overrides the answer (see BF16_PATH_VARIABLE)."""
    forced = os.environ.get(BF16_PATH_VARIABLE, "auto")
    if forced in ("native", "fp32"):
        return forced == "native"
    if forced != "auto":
        raise ValueError(f"{BF16_PATH_VARIABLE} must be native, fp32 or auto, got {forced!r}")
    try:
        with open("/proc/cpuinfo") as cpuinfo:
            flags = cpuinfo.read()
    except OSError:
        return False
    return "avx512_bf16" in flags or "amx_bf16" in flags


#: What runs instead of a native kernel when no C compiler is found (said in the
#: warning and by `accord backends`).
NO_COMPILER_FALLBACK = "no C compiler found ($CC, gcc or cc): the native kernels run their torch paths instead"


def find_compiler() -> str | None:
    """The C compiler the native kernels are built with: $CC, else gcc, else cc."""
    return os.environ.get("CC") or shutil.which("gcc") or shutil.which("cc")
