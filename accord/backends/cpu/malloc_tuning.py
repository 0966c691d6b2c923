"""glibc's malloc kept from returning large blocks to the kernel between steps.

glibc serves every allocation of 32 MiB or more (its largest dynamic mmap threshold)
with a fresh mmap and unmaps it on free, so each large step's activations are
page-faulted in again on every step: at a 4096-token budget that was 8-9% of the CPU
time of a mixed trace on a 2-core Sapphire Rapids. With mmap off for malloc
(M_MMAP_MAX = 0) and the heap never trimmed (M_TRIM_THRESHOLD), a freed block stays in
the heap and the next step reuses its pages. The cost: memory freed by the process is
not handed back to the system until it exits.

Why not tcmalloc or jemalloc: an allocator replaces malloc only when it is loaded before
libc's is used, that is through LD_PRELOAD, which a user must not have to set; and PyPI
ships no tcmalloc wheel (only Debian packages do). mallopt is glibc's own switch and
needs nothing installed. `ACCORD_CPU_MALLOC_TUNING=0` leaves malloc as it is.
"""

from __future__ import annotations

import ctypes
import logging
import os
from functools import cache

logger = logging.getLogger(__name__)

#: Turns the tuning off when set to 0.
TUNING_VARIABLE = "ACCORD_CPU_MALLOC_TUNING"
#: glibc's mallopt parameters (malloc.h).
M_TRIM_THRESHOLD, M_MMAP_MAX = -1, -4
#: The free space at the top of the heap past which glibc gives it back: the largest
#: value mallopt takes (an int), so in practice never.
NEVER_TRIM = 2**31 - 1


@cache
def tune_glibc_malloc() -> bool:
    """Set glibc's malloc to keep large blocks in its heap (once per process); whether it
    did (False where libc is not glibc, or when ACCORD_CPU_MALLOC_TUNING=0)."""
    if os.environ.get(TUNING_VARIABLE, "1") == "0":
        return False
    try:
        mallopt = ctypes.CDLL(None).mallopt
    except (OSError, AttributeError):  # not glibc (musl, macOS): its allocator is as it is
        return False
    mallopt.argtypes, mallopt.restype = [ctypes.c_int, ctypes.c_int], ctypes.c_int
    tuned = bool(mallopt(M_MMAP_MAX, 0)) and bool(mallopt(M_TRIM_THRESHOLD, NEVER_TRIM))
    if not tuned:
        logger.warning("glibc's mallopt refused the cpu backend's malloc settings: large steps page-fault as before")
    return tuned
