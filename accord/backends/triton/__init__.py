"""Triton kernels shared by the cuda and rocm backends; on a CPU host they run under
the Triton interpreter (TRITON_INTERPRET=1) for conformance on small shapes."""

from __future__ import annotations

import importlib.util
from typing import Mapping

import torch

from ...op_contracts import KernelSet
from ..base import Availability, Backend, ToleranceOverride
from .gpu_backend import GpuBackend
from .interpreter import triton_interpreter_enabled


class TritonBackend(GpuBackend):
    """The Triton kernels alone (no vendor fast paths) on whatever device Triton
    targets: a GPU, or the CPU interpreter when TRITON_INTERPRET=1.

    The interpreter needs no declared tolerance widening: the kernels round every
    bf16 and fp8 store through an exact fp32 grid and run bf16 dots in fp32 there (see
    kernels/_numerics.py), so its results meet the contracts' own tolerances, and it
    takes both fp8 formats, which a GPU does not."""

    name = "triton"
    priority = 5
    use_torch_fast_paths = False
    description = "Triton kernels (GPU, or CPU under TRITON_INTERPRET=1)"

    @property
    def device_type(self) -> str:  # type: ignore[override]
        return "cpu" if triton_interpreter_enabled() else "cuda"

    @property
    def dist_backend(self) -> str:  # type: ignore[override]
        # Interpreted kernels keep their tensors on the CPU, where nccl cannot reach.
        return "gloo" if triton_interpreter_enabled() else "nccl"

    def availability(self) -> Availability:
        if importlib.util.find_spec("triton") is None:
            return Availability(False, "triton is not installed (pip install 'accord[triton]')")
        if triton_interpreter_enabled() or torch.cuda.is_available():
            return Availability(True)
        return Availability(False, "no CUDA/ROCm device; set TRITON_INTERPRET=1 to run the kernels on the CPU")

    def tolerance_override(self, op: str, dtypes: Mapping[str, torch.dtype]) -> ToleranceOverride | None:
        # The interpreter runs fused_moe's exact (dequantised) fp8 path: no widening.
        return None if triton_interpreter_enabled() else super().tolerance_override(op, dtypes)

    def fp8_dtype(self) -> torch.dtype:
        return torch.float8_e4m3fn if triton_interpreter_enabled() else super().fp8_dtype()

    def memory_info(self) -> tuple[int, int]:
        return Backend.memory_info(self) if triton_interpreter_enabled() else super().memory_info()

    def device_count(self) -> int | None:
        return None if triton_interpreter_enabled() else super().device_count()

    def select_device(self, local_rank: int) -> None:
        if not triton_interpreter_enabled():
            super().select_device(local_rank)

    def synchronize(self) -> None:
        if not triton_interpreter_enabled():
            super().synchronize()

    def versions(self) -> dict[str, str]:
        mode = "interpreter (TRITON_INTERPRET=1)" if triton_interpreter_enabled() else "compiled"
        return super().versions() | {"triton_mode": mode}

    def load_kernels(self) -> KernelSet:
        if triton_interpreter_enabled():
            from .kernels import KERNELS

            return KERNELS
        return super().load_kernels()
