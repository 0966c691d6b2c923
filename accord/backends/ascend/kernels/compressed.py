"""DeepSeek-V4's compressed-KV ops (kv_compress, indexer_topk, compressed_attention) in
plain torch on the NPU: torch-npu documents no fused operator with these contracts'
paged layout, so the cpu backend's batched torch kernels (device-agnostic torch ops)
run here until one exists."""

from __future__ import annotations

from ....op_contracts import KernelSet
from ...cpu.kernels import KERNELS as CPU_KERNELS

OPS = ("kv_compress", "indexer_topk", "compressed_attention")


def register(kernels: KernelSet) -> None:
    """Add the three kernels."""
    for op in OPS:
        kernel = CPU_KERNELS.get(op)
        assert kernel is not None, f"the cpu backend registers {op}"
        kernels.add(kernel)
