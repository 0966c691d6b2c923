"""A third-party accord backend in one file: it registers through the
`accord.backends` entry point and implements two contracts, rms_norm and
silu_and_mul, in fp32 torch. Every other op is reported unsupported."""

from __future__ import annotations

import torch

from accord.backends import Backend, hookimpl
from accord.op_contracts import KernelSet

KERNELS = KernelSet("demo")


@KERNELS.register("rms_norm")
def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float, out: torch.Tensor) -> None:
    """Llama's RMSNorm, accumulated in fp32."""
    x32 = x.float()
    out.copy_(x32 * torch.rsqrt(x32.pow(2).mean(-1, keepdim=True) + eps) * weight.float())


@KERNELS.register("silu_and_mul", claims={"x": (torch.float32,)})
def silu_and_mul(x: torch.Tensor, out: torch.Tensor) -> None:
    """SwiGLU's gate, fp32 only (other dtypes are declined, not run)."""
    half = x.shape[1] // 2
    out.copy_(torch.nn.functional.silu(x[:, :half]) * x[:, half:])


class DemoBackend(Backend):
    """Two kernels on the CPU, as a plugin author's first step looks."""

    name = "demo"
    device_type = "cpu"
    priority = -1
    description = "third-party demo backend (tests/plugins)"

    def load_kernels(self) -> KernelSet:
        return KERNELS


@hookimpl
def accord_backends() -> list[Backend]:
    return [DemoBackend()]
