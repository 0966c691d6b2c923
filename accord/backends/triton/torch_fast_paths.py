"""Vendor fast paths torch exposes, behind the same contracts as the Triton kernels:
scaled_mm through torch._scaled_mm (cuBLASLt on NVIDIA, hipBLASLt on AMD) where the
call fits it, the Triton kernel otherwise. Only GPU backends install these."""

from __future__ import annotations

import torch

from ...op_contracts import Kernel

#: torch._scaled_mm wants K and N in multiples of 16.
_SCALED_MM_ALIGNMENT = 16
#: Architectures with fp8 GEMMs in torch._scaled_mm: Ada / Hopper / Blackwell, MI300+.
_FP8_GEMM_ARCHITECTURES = ("sm_89", "sm_9", "sm_10", "sm_12", "gfx94", "gfx95")


def scaled_mm_fits_torch(
    architecture: str, a: torch.Tensor, b: torch.Tensor, scale_mode: str, bias: torch.Tensor | None, out_dtype: torch.dtype
) -> bool:
    """Whether torch._scaled_mm computes this scaled_mm call as the contract defines it:
    a per-tensor call on an fp8-GEMM architecture, aligned, with a bias (if any) in
    the output dtype."""
    return (
        a.device.type == "cuda"
        and architecture.startswith(_FP8_GEMM_ARCHITECTURES)
        and scale_mode == "tensor"
        and a.shape[1] % _SCALED_MM_ALIGNMENT == 0
        and b.shape[0] % _SCALED_MM_ALIGNMENT == 0
        and (bias is None or bias.dtype == out_dtype)
    )


def scaled_mm_with_torch(triton_kernel: Kernel, architecture: str) -> Kernel:
    """The scaled_mm kernel that takes torch._scaled_mm where it fits, the Triton kernel
    elsewhere; it claims exactly what the Triton kernel claims."""

    def scaled_mm(
        a: torch.Tensor,
        b: torch.Tensor,
        a_scale: torch.Tensor,
        b_scale: torch.Tensor,
        bias: torch.Tensor | None,
        scale_mode: str,
        out_dtype: torch.dtype,
        out: torch.Tensor,
    ) -> None:
        if not scaled_mm_fits_torch(architecture, a, b, scale_mode, bias, out_dtype):
            triton_kernel.fn(a=a, b=b, a_scale=a_scale, b_scale=b_scale, bias=bias,
                             scale_mode=scale_mode, out_dtype=out_dtype, out=out)
            return
        # b is [N, K] row-major, so b.t() is the column-major [K, N] operand cuBLASLt wants.
        out.copy_(torch._scaled_mm(a, b.t(), a_scale.reshape(()), b_scale.reshape(()), bias=bias, out_dtype=out_dtype))

    return Kernel("scaled_mm", scaled_mm, triton_kernel.claims, triton_kernel.supports, triton_kernel.adapters)
