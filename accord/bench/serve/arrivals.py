"""When each request is sent: a gamma process of the given rate (vLLM's `--burstiness`:
1 is Poisson, below 1 burstier, above 1 more even), or every request at once for an
infinite rate."""

from __future__ import annotations

import math

import numpy as np


def arrival_times(count: int, request_rate: float, burstiness: float, seed: int) -> list[float]:
    """Seconds from the start at which each of `count` requests is sent. The gaps are
    gamma(shape=burstiness, scale=1/(rate*burstiness)), mean 1/rate; as vLLM does, they
    are scaled so the last request goes at `count / rate` (a finite draw's sum misses
    that by a few percent, which would move throughput between seeds)."""
    if burstiness <= 0:
        raise ValueError(f"--burstiness must be positive, got {burstiness}")
    if request_rate <= 0:
        raise ValueError(f"--request-rate must be positive, got {request_rate}")
    if math.isinf(request_rate):
        return [0.0] * count
    gaps = np.random.default_rng(seed).gamma(shape=burstiness, scale=1.0 / (request_rate * burstiness), size=count)
    times = np.cumsum(gaps)
    return (times * (count / request_rate / times[-1])).tolist() if count else []
