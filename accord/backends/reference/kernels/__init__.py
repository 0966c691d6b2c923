"""The reference kernels, one module per contract family; importing registers them."""

from ._registry import KERNELS
from . import attention, cache, compressed, elementwise, fp8, group_quant, linear, lora, moe, quant, sampling  # noqa: F401  (registers kernels)

__all__ = ["KERNELS"]
