"""The cpu kernels, one module per contract family; importing registers them (and
compiles nothing: the backend starts the native builds when it loads its kernels)."""

from ._registry import KERNELS
from . import attention, cache, compressed, elementwise, fp8, group_quant, linear, lora, moe, quant, rejection, sampling  # noqa: F401  (registers kernels)
from . import batch_invariant  # noqa: F401  (registers the --batch-invariant variants)
from . import _native, _native_attention, _native_elementwise, _native_gemm, _native_group_quant, _native_lora, _native_quant



def start_native_builds() -> None:
    """Start building the native libraries the kernels use, side by side, in the
    background (cached, and once per process)."""
    for library in (
        _native_gemm.LIBRARY, _native_elementwise.LIBRARY, _native_attention.LIBRARY, _native_attention.PREFILL_LIBRARY,
        _native_quant.LIBRARY, _native_lora.LIBRARY, _native_group_quant.LIBRARY,
    ):
        _native.build_ahead(*library)


__all__ = ["KERNELS", "start_native_builds"]
