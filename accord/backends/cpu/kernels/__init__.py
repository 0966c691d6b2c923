"""The cpu kernels, one module per contract family; importing registers them and starts
building the native libraries they use, side by side, in the background."""

from ._registry import KERNELS
from . import attention, cache, compressed, elementwise, fp8, linear, moe, sampling  # noqa: F401  (registers kernels)
from . import _native, _native_attention, _native_elementwise, _native_gemm

for _library in (_native_gemm.LIBRARY, _native_elementwise.LIBRARY, _native_attention.LIBRARY):
    _native.build_ahead(*_library)

__all__ = ["KERNELS"]
