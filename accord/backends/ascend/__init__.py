"""The ascend backend: Huawei Ascend NPUs through torch-npu's fused operators (CANN),
with HCCL for collectives. Optional extra `ascend`.

ACCORD_NPU_EMULATE=1 runs the same kernels against accord's CPU emulator of those
operators (`emulator/`), so conformance checks the glue and the dtype claims on any
machine; the emulated backend is never picked by `--backend auto`."""

from __future__ import annotations

import importlib.metadata
import os
from types import ModuleType
from typing import Any

import torch

import importlib.util
from ...op_contracts import KernelSet
from ..base import Availability, Backend
from ..communicator import CollectiveSupport
from .communicator import HCCL

EMULATE_VARIABLE = "ACCORD_NPU_EMULATE"


def emulation_requested() -> bool:
    """Whether ACCORD_NPU_EMULATE asks for the operator emulator."""
    return os.environ.get(EMULATE_VARIABLE, "").strip().lower() in ("1", "true", "yes", "on")


def _torch_npu_version() -> str:
    try:
        return importlib.metadata.version("torch-npu")
    except importlib.metadata.PackageNotFoundError:
        return "unknown"


def torch_npu_installed() -> bool:
    """Whether a torch_npu package is importable (found without importing it)."""
    return importlib.util.find_spec("torch_npu") is not None


#: What the dynamic loader says when one of CANN's shared libraries is absent.
MISSING_LIBRARY = "cannot open shared object file"


def torch_npu_unavailable() -> str | None:
    """Why torch-npu cannot drive an NPU here, precisely, or None when it can: not
    installed; installed without the CANN runtime; failing to import; or no NPU visible."""
    if not torch_npu_installed():
        return "torch-npu is not installed (pip install 'accord[ascend]'; it needs the CANN toolkit too)"
    version = _torch_npu_version()
    try:
        import torch_npu  # noqa: F401  (registers the npu device with torch)
    except Exception as error:  # noqa: BLE001 - a broken install must not break listing
        if MISSING_LIBRARY in str(error):
            return (f"torch-npu {version} is installed but the CANN runtime is not ({error}); install the CANN "
                    "toolkit and kernels that match it and source its set_env.sh")
        return f"torch-npu {version} failed to import: {type(error).__name__}: {error}"
    if not torch.npu.is_available():  # type: ignore[attr-defined]
        return (f"torch-npu {version} and CANN are present but no NPU is visible (torch.npu.is_available() is "
                "False; check `npu-smi info` and ASCEND_RT_VISIBLE_DEVICES)")
    return None


class AscendBackend(Backend):
    """Huawei Ascend NPUs through torch-npu, or its operator emulator on the CPU."""

    name = "ascend"
    device_type = "npu"
    priority = 30
    dist_backend = "hccl"
    description = "Huawei Ascend via torch-npu's fused operators"

    def __init__(self, emulate: bool | None = None) -> None:
        super().__init__()
        self.emulated = emulation_requested() if emulate is None else emulate
        # The emulator runs the operators on the CPU, so tensors live there.
        self.device_type = "cpu" if self.emulated else "npu"

    def availability(self) -> Availability:
        if self.emulated:
            return Availability(True, f"emulated on the CPU ({EMULATE_VARIABLE}=1): checks the glue and dtype "
                                "claims, not NPU numerics; never chosen by --backend auto", auto_selectable=False)
        reason = torch_npu_unavailable()
        return Availability(reason is None, reason or "")

    def operators(self) -> ModuleType:
        """The namespace the kernels call npu_* operators on: torch_npu, or the emulator."""
        if self.emulated:
            from . import emulator

            return emulator
        import torch_npu

        return torch_npu

    def load_kernels(self) -> KernelSet:
        from .kernels import build_kernels

        return build_kernels(self.operators())

    def compute_dtype(self, requested: torch.dtype) -> torch.dtype:
        """bf16 for an fp32 model: FIA, the attention operator, has no fp32 path (as
        vLLM serves fp32 checkpoints in bf16 by default); fp16 and bf16 as asked."""
        return torch.bfloat16 if requested == torch.float32 else requested

    def batch_variant_ops(self) -> frozenset[str]:
        # Grouped matmuls and GEMMs pick their tiling by the number of rows, and the
        # routing operators sort tokens by expert: a row's rounding depends on its batch.
        # lora_linear is the cpu backend's torch code, which groups rows by adapter slot.
        return frozenset({"moe_route", "fused_moe", "linear", "lora_linear"})

    def collective_support(self) -> CollectiveSupport:
        """HCCL's dtype contract as CANN documents it for Atlas A2/A3 (communicator.py)."""
        return HCCL

    def supported_block_sizes(self) -> tuple[int, ...]:
        from .kernels.attention import BLOCK_SIZES

        return BLOCK_SIZES

    def memory_info(self) -> tuple[int, int]:
        if self.emulated:
            return super().memory_info()
        free, total = torch.npu.mem_get_info()  # type: ignore[attr-defined]
        return free, total

    def device_count(self) -> int | None:
        return None if self.emulated else torch.npu.device_count()  # type: ignore[attr-defined]

    def synchronize(self) -> None:
        if not self.emulated:
            torch.npu.synchronize()  # type: ignore[attr-defined]

    def versions(self) -> dict[str, str]:
        versions = {"torch": torch.__version__, "torch_npu": _torch_npu_version() if torch_npu_installed() else "not installed"}
        if self.emulated:
            from .emulator import EMULATED_SOC

            return versions | {"device": f"emulated {EMULATED_SOC} (CPU)"}
        npu: Any = getattr(torch, "npu", None)
        if npu is not None and npu.is_available():
            versions["device"] = npu.get_device_name()
        cann = os.environ.get("ASCEND_TOOLKIT_HOME") or os.environ.get("ASCEND_HOME_PATH")
        if cann:
            versions["cann_home"] = cann
        return versions
