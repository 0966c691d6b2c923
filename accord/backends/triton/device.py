"""GPU facts the cuda, rocm and triton backends decide by: the device architecture, the
fp8 storage format it implies, and the load-time conversion of e4m3fn weights for
devices that store e4m3fnuz. Everything here is decided at run time from the device,
never from which vendor's torch build is installed."""

from __future__ import annotations

import torch

from ...op_contracts import FP8_DTYPES, CallSignature, Kernel, KernelSet, dtype_name

#: AMD architectures whose fp8 is e4m3fnuz (MI300-class, gfx94x); gfx95x and NVIDIA
#: use OCP e4m3fn.
_FNUZ_ARCH_PREFIXES = ("gfx94",)


def gpu_architecture(index: int = 0) -> str:
    """The architecture of GPU `index`: `sm_90` on NVIDIA, `gfx942` on AMD (from
    hip-python's device properties when installed, torch's otherwise)."""
    if getattr(torch.version, "hip", None) is not None:
        return _hip_architecture(index)
    major, minor = torch.cuda.get_device_capability(index)
    return f"sm_{major}{minor}"


def _hip_architecture(index: int) -> str:
    try:
        from hip import hip  # optional: the accord[rocm] extra
    except ImportError:
        return torch.cuda.get_device_properties(index).gcnArchName.split(":")[0]
    _, properties = hip.hipGetDeviceProperties(index)
    name = properties.gcnArchName
    return (name.decode() if isinstance(name, bytes) else str(name)).split(":")[0]


def fp8_dtype_for_architecture(architecture: str) -> torch.dtype:
    """The fp8 format a device of `architecture` computes in: e4m3fnuz on gfx94x,
    OCP e4m3fn on NVIDIA and on every other AMD generation."""
    if architecture.startswith(_FNUZ_ARCH_PREFIXES):
        return torch.float8_e4m3fnuz
    return torch.float8_e4m3fn


def e4m3fn_to_e4m3fnuz(weight: torch.Tensor, scale: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """An e4m3fn weight and its scale as an e4m3fnuz device holds them, dequantising to
    the same values: the same bits read as e4m3fnuz are worth half (exponent bias 8,
    not 7), so the scale doubles; 0x80 (e4m3fn's -0, e4m3fnuz's NaN) becomes 0."""
    if weight.dtype != torch.float8_e4m3fn:
        raise ValueError(f"expected an e4m3fn weight, got {dtype_name(weight.dtype)}")
    bits = weight.view(torch.uint8)
    bits = torch.where(bits == 0x80, torch.zeros_like(bits), bits)
    return bits.view(torch.float8_e4m3fnuz), scale * 2.0


def restrict_fp8(kernels: KernelSet, fp8_dtype: torch.dtype) -> KernelSet:
    """`kernels` refusing every signature that has an fp8 tensor or fp8 dtype parameter
    of another format than the device's `fp8_dtype` (a GPU computes in one flavour;
    the interpreter in both)."""
    restricted = KernelSet(kernels.backend)
    for kernel in kernels.as_dict().values():
        restricted.add(_with_fp8_check(kernel, fp8_dtype))
    return restricted


def _foreign_fp8(signature: CallSignature, fp8_dtype: torch.dtype) -> tuple[str, torch.dtype] | None:
    """The first argument whose fp8 format is not `fp8_dtype`, with that format."""
    dtypes = [(name, key[0]) for name, key in signature.tensors if key is not None]
    dtypes += [(name, value) for name, value in signature.params if isinstance(value, torch.dtype)]
    for name, dtype in dtypes:
        if dtype in FP8_DTYPES and dtype != fp8_dtype:
            return name, dtype
    return None


def _with_fp8_check(kernel: Kernel, fp8_dtype: torch.dtype) -> Kernel:
    def supports(signature: CallSignature) -> str | None:
        foreign = _foreign_fp8(signature, fp8_dtype)
        if foreign is not None:
            name, dtype = foreign
            return f"{name} is {dtype_name(dtype)} but this device computes fp8 as {dtype_name(fp8_dtype)}"
        return kernel.supports(signature) if kernel.supports is not None else None

    return Kernel(kernel.op, kernel.fn, kernel.claims, supports, kernel.adapters)
