"""HCCL, the ascend backend's collective communicator, described as data: which dtypes
each kind of collective carries on Atlas A2/A3 (CANN's HcclAllReduce / HcclAllGather
documentation). The communicator machinery reads these limits; what HCCL cannot carry
is a declared adapter or a refusal there, never a silent cast."""

from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass(frozen=True)
class CommunicatorLimits:
    """A communicator's dtype limits: what reductions (all_reduce, reduce_scatter) and
    plain data movement (all_gather, broadcast, all_to_all, send/recv) take, and the
    dtypes a `prod` reduction excludes."""

    name: str
    reduce_dtypes: tuple[torch.dtype, ...]
    move_dtypes: tuple[torch.dtype, ...]
    no_prod_dtypes: tuple[torch.dtype, ...] = ()
    notes: str = ""


HCCL = CommunicatorLimits(
    name="hccl",
    reduce_dtypes=(torch.int8, torch.int16, torch.int32, torch.int64, torch.float16, torch.float32, torch.bfloat16),
    move_dtypes=(
        torch.int8, torch.int16, torch.int32, torch.int64, torch.uint8, torch.float16, torch.float32,
        torch.bfloat16, torch.float64,
    ),
    no_prod_dtypes=(torch.int16, torch.bfloat16),
    notes=(
        "Atlas A2/A3 (CANN 8.x): no fp8 in any collective (CANN 9 adds fp8 types for newer chips); fp8 "
        "tensors can move as their uint8 bytes, never be reduced; prod is not supported for int16 and bf16."
    ),
)
