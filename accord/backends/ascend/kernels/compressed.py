"""DeepSeek-V4's compressed-KV ops (kv_compress, indexer_topk, compressed_attention) in
plain torch on the device, shared with the cpu backend, whose kernels are written
device-agnostic. No torch-npu fused operator takes the contracts' layout as it is:
npu_lightning_indexer and npu_sparse_flash_attention read dense paged keys, while the
compressed entries sit at strided slots ((w+1)*R-1) of the paged cache; a fused path
would first gather them (a follow-up measured on a node)."""

from __future__ import annotations

from ....op_contracts import KernelSet
from ...cpu.kernels import KERNELS as CPU_KERNELS

OPS = ("kv_compress", "indexer_topk", "compressed_attention")


def register(kernels: KernelSet) -> None:
    """Add the three compressed-KV kernels of the cpu backend."""
    for op in OPS:
        kernel = CPU_KERNELS.get(op)
        assert kernel is not None, f"the cpu backend lost its {op} kernel"
        kernels.add(kernel)
