"""Triton kernels shared by the cuda and rocm backends; on a CPU host they run under
the Triton interpreter (TRITON_INTERPRET=1) for conformance on small shapes."""

from __future__ import annotations

import importlib.util
import os

import torch

from ...op_contracts import KernelSet
from ..base import Availability, Backend


def triton_interpreter_enabled() -> bool:
    """Whether TRITON_INTERPRET=1 asks Triton to run kernels on the CPU."""
    return os.environ.get("TRITON_INTERPRET", "0") == "1"


class TritonBackend(Backend):
    """The Triton kernels on whatever device Triton targets (a GPU, or the CPU
    interpreter when TRITON_INTERPRET=1)."""

    name = "triton"
    priority = 5
    description = "Triton kernels (GPU, or CPU under TRITON_INTERPRET=1)"

    @property
    def device_type(self) -> str:  # type: ignore[override]
        return "cpu" if triton_interpreter_enabled() else "cuda"

    def availability(self) -> Availability:
        if importlib.util.find_spec("triton") is None:
            return Availability(False, "triton is not installed (pip install 'accord[triton]')")
        if triton_interpreter_enabled() or torch.cuda.is_available():
            return Availability(True)
        return Availability(False, "no CUDA/ROCm device; set TRITON_INTERPRET=1 to run the kernels on the CPU")

    def load_kernels(self) -> KernelSet:
        from .kernels import KERNELS

        return KERNELS
