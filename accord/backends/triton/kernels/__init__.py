"""The Triton kernels, one module per contract family; importing registers them."""

from ._registry import KERNELS
from . import activation, attention, cache, fp8, fused_moe, kv_compress, linear, lora, moe_route, norm, quant, rotary, torch_kernels  # noqa: F401  (registers kernels)

__all__ = ["KERNELS"]
