"""Autotuning shared by the Triton kernel families.

On a GPU each tuned kernel benchmarks its tile configurations once per key (the shape
class its caller passes) and keeps the winner: in the process, and on disk through
Triton's autotune cache (`cache_results`), whose entries are keyed by the device's
compile target, so a cache filled on an H200 is never read on another GPU. Under the
interpreter one small configuration runs (benchmarking there would only multiply the
run time of the CPU tests).
"""

from __future__ import annotations

from typing import Sequence

import triton

from ..interpreter import triton_interpreter_enabled


def tuned(gpu_configs: Sequence[triton.Config], interpreter_config: triton.Config, key: list[str]):
    """`triton.autotune` over `gpu_configs` keyed by `key` on GPUs; the single
    `interpreter_config` under TRITON_INTERPRET=1."""
    if triton_interpreter_enabled():
        return triton.autotune(configs=[interpreter_config], key=key)
    return triton.autotune(configs=list(gpu_configs), key=key, cache_results=True)


def row_class(rows: int) -> int:
    """Autotune key for a row count: its power-of-two bucket, so a tile is tuned once per
    batch-size class rather than once per batch size."""
    return triton.next_power_of_2(max(rows, 1))
