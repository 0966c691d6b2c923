"""Contracts no Triton kernel implements yet, run as the cpu backend's kernels, which are
written in device-agnostic torch: sampling (its seeded draws are made on the host, as the
contract defines them), the rejection sampler (its uniforms come made) and DeepSeek-V4's
indexer top-k and compressed attention. Without
them the GPU backends could not serve at all, and `--backend auto` rightly passes over a
backend with missing kernels."""

from __future__ import annotations

from ...cpu.kernels import KERNELS as CPU_KERNELS
from ._registry import KERNELS

OPS = ("sample", "rejection_sample", "indexer_topk", "compressed_attention")

for op in OPS:
    kernel = CPU_KERNELS.get(op)
    assert kernel is not None, f"the cpu backend lost its {op} kernel"
    KERNELS.add(kernel)
