"""The ascend backend on torch-npu's fused ops (CANN). Optional extra `ascend`."""

from __future__ import annotations

import importlib.util

from ...op_contracts import KernelSet
from ..base import Availability, Backend


class AscendBackend(Backend):
    """Huawei Ascend NPUs through torch-npu; unavailable without it and a device."""

    name = "ascend"
    device_type = "npu"
    priority = 30
    dist_backend = "hccl"
    description = "Huawei Ascend via torch-npu"

    def availability(self) -> Availability:
        if importlib.util.find_spec("torch_npu") is None:
            return Availability(False, "torch-npu is not installed (pip install 'accord[ascend]')")
        try:
            import torch_npu  # noqa: F401  (registers the npu device with torch)
            import torch

            if not torch.npu.is_available():  # type: ignore[attr-defined]
                return Availability(False, "torch-npu found no Ascend device")
        except Exception as error:  # a broken CANN install must not break listing
            return Availability(False, f"torch-npu failed to initialise: {error}")
        return Availability(True)

    def load_kernels(self) -> KernelSet:
        # No Ascend kernels are written yet: every op is reported unsupported by
        # conformance and refused by the dispatcher, never silently run elsewhere.
        return KernelSet()
