"""HCCL's dtype contract as CANN documents it for Atlas A2/A3 (HcclAllReduce,
HcclReduceScatter, HcclAllGather, HcclAlltoAllV): reductions carry int8, int16, int32,
int64, fp16, fp32 and bf16; data movement also carries uint8 and fp64. HCCL has no fp8
type on these chips (CANN 9 adds fp8 types for newer ones) and no bool: fp8 reduces in
fp32 and moves as bytes, bool moves as bytes; nothing else is carried or adapted."""

from __future__ import annotations

import torch

from ...op_contracts import FP8_DTYPES
from ..communicator import DATA_MOVEMENT, REDUCTIONS, CollectiveAdapter, CollectiveSupport

REDUCED = (torch.int8, torch.int16, torch.int32, torch.int64, torch.float16, torch.float32, torch.bfloat16)
MOVED = (*REDUCED, torch.uint8, torch.float64)


def hccl_support() -> CollectiveSupport:
    """The collective dtype contract of the ascend backend's communicator."""
    native = {c: frozenset(REDUCED) for c in REDUCTIONS} | {c: frozenset(MOVED) for c in DATA_MOVEMENT}
    adapters = {(c, d): CollectiveAdapter("upcast", torch.float32) for c in REDUCTIONS for d in FP8_DTYPES}
    adapters |= {(c, d): CollectiveAdapter("bytes") for c in DATA_MOVEMENT for d in (*FP8_DTYPES, torch.bool)}
    return CollectiveSupport("hccl", native, adapters)


HCCL = hccl_support()
