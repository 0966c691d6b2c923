"""The base of the backends that run the Triton kernels on a GPU (cuda, rocm, and
triton itself off the interpreter): device checks, memory and synchronisation through
torch.cuda, the fp8 format read from the device's architecture at run time, and the
load-time conversion of e4m3fn checkpoints for e4m3fnuz devices."""

from __future__ import annotations

import importlib.metadata
import importlib.util
from functools import cached_property
from typing import Callable, Mapping

import torch

from ...op_contracts import FP8_DTYPES, KernelSet
from ..base import Availability, Backend, ToleranceOverride
from .device import e4m3fn_to_e4m3fnuz, fp8_dtype_for_architecture, gpu_architecture, restrict_fp8
from .torch_fast_paths import scaled_mm_with_torch

#: fused_moe's NMSE bound on GPUs for half activations: the fp8-dot path quantises the
#: activations and the SwiGLU intermediate to e4m3 per 128-wide group (about 3 bits of
#: mantissa each), measured at 1.5e-3..1.9e-3 against the reference on random data
#: (both fp8 flavours, bf16/fp16/fp32 activations, under the interpreter); the bound is
#: the contracts' fp8 reduction bound, what an fp8 GEMM is allowed.
FP8_DOT_MOE_NMSE = 5e-3


class GpuBackend(Backend):
    """Triton kernels on a torch.cuda device (torch exposes HIP devices as "cuda" too).

    Subclasses say which torch build they need (`runtime_missing`) and whether torch's
    vendor fast paths join the Triton kernels (`use_torch_fast_paths`)."""

    device_type = "cuda"
    dist_backend = "nccl"
    #: Whether vendor fast paths (torch._scaled_mm) replace Triton kernels where they fit.
    use_torch_fast_paths: bool = True
    #: How the availability message names this backend's GPUs ("NVIDIA", "AMD").
    vendor: str = "CUDA/ROCm"
    #: The CUDA graph memory pool every captured bucket shares (made on first capture).
    _graph_pool: tuple[int, int] | None = None
    captures_graphs = True

    def runtime_missing(self) -> str | None:
        """Why this torch build cannot drive this backend's GPUs, or None when it can."""
        return None

    def availability(self) -> Availability:
        missing = self.runtime_missing()
        if missing is not None:
            return Availability(False, missing)
        if importlib.util.find_spec("triton") is None:
            return Availability(False, "triton is not installed (pip install 'accord[triton]')")
        if not torch.cuda.is_available():
            return Availability(False, f"no {self.vendor} GPU is visible (torch.cuda.is_available() is False)")
        return Availability(True)

    @cached_property
    def architecture(self) -> str:
        """The current GPU's architecture (`sm_90`, `gfx942`), read once."""
        return gpu_architecture(torch.cuda.current_device())

    def fp8_dtype(self) -> torch.dtype:
        return fp8_dtype_for_architecture(self.architecture)

    def device_count(self) -> int | None:
        return torch.cuda.device_count()

    def select_device(self, local_rank: int) -> None:
        torch.cuda.set_device(local_rank % torch.cuda.device_count())

    def prepare_fp8_weight(self, weight: torch.Tensor, scale: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """A checkpoint's e4m3fn weight and its scale as this device stores them:
        converted at load time where the device computes in e4m3fnuz, else unchanged."""
        if weight.dtype == torch.float8_e4m3fn and self.fp8_dtype() == torch.float8_e4m3fnuz:
            return e4m3fn_to_e4m3fnuz(weight, scale)
        return weight, scale

    def tolerance_override(self, op: str, dtypes: Mapping[str, torch.dtype]) -> ToleranceOverride | None:
        """fused_moe with fp8 weights and half activations runs fp8 tensor-core dots on
        activations quantised per 128-wide token group (kernels/fused_moe.py), where
        the contract keeps every step in fp32: it is held to the fp8 GEMM bound. Half
        weights keep their own (tighter) bound."""
        fp8_weights = dtypes.get("w13") in FP8_DTYPES
        if op == "fused_moe" and fp8_weights and dtypes.get("hidden") in (torch.float16, torch.bfloat16):
            return ToleranceOverride(
                FP8_DOT_MOE_NMSE, "fp8 expert weights: activations quantised to fp8 per 128-wide group for fp8 dots"
            )
        return None

    def memory_info(self) -> tuple[int, int]:
        free, total = torch.cuda.mem_get_info()
        return free, total

    def synchronize(self) -> None:
        torch.cuda.synchronize()

    def graph_capture(self, fn: Callable[[], torch.Tensor]) -> Callable[[], torch.Tensor]:
        """Capture `fn` into a CUDA graph: one warm-up run on a side stream first (lazy
        initialisation and Triton autotuning must not happen inside the capture), then
        the capture into a memory pool shared by every bucket; the replay returns the
        output tensor the capture allocated, rewritten in place by each replay."""
        stream = torch.cuda.Stream()
        stream.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(stream):
            fn()
        torch.cuda.current_stream().wait_stream(stream)
        if self._graph_pool is None:
            self._graph_pool = torch.cuda.graph_pool_handle()
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph, pool=self._graph_pool):
            output = fn()

        def replay() -> torch.Tensor:
            graph.replay()
            return output

        return replay

    def versions(self) -> dict[str, str]:
        runtime = getattr(torch.version, "hip", None) or torch.version.cuda or "none"
        versions = {"torch": torch.__version__, "triton": _installed_version("triton"), "gpu_runtime": runtime}
        if torch.cuda.is_available():
            versions |= {"device": torch.cuda.get_device_name(), "architecture": self.architecture}
        return versions

    def load_kernels(self) -> KernelSet:
        from .kernels import KERNELS

        kernels = restrict_fp8(KERNELS, self.fp8_dtype())
        if self.use_torch_fast_paths:
            kernels.add(scaled_mm_with_torch(kernels.get("scaled_mm"), self.architecture))
        return kernels


def _installed_version(package: str) -> str:
    """The installed version of `package`, or "not installed"."""
    try:
        return importlib.metadata.version(package)
    except importlib.metadata.PackageNotFoundError:
        return "not installed"
