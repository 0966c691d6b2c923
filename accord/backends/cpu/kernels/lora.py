"""Multi-LoRA on the CPU: lora_linear.c's BGMV kernel (one shrink and one expand over
every token with its own slot's A and B, no loop over slots in Python) for fp32 and bf16
on the host; elsewhere (fp16, device tensors of the backends that register this kernel,
no C compiler) the SGMV-style torch path: the rows grouped by adapter slot, two fp32
GEMMs per slot the batch uses."""

from __future__ import annotations

import torch

from . import _native_lora
from ._registry import KERNELS


@KERNELS.register("lora_linear")
def lora_linear(
    y: torch.Tensor, x: torch.Tensor, lora_a: torch.Tensor, lora_b: torch.Tensor, slot_ids: torch.Tensor,
    out: torch.Tensor,
) -> None:
    """out = y, plus x @ A[s]^T @ B[s] in fp32 on the rows of each slot s the batch names."""
    if x.device.type == "cpu" and x.dtype in _native_lora.DTYPES and _native_lora.available():
        _native_lora.lora_linear(y.contiguous(), x if x.stride(1) == 1 else x.contiguous(), lora_a.contiguous(),
                                 lora_b.contiguous(), slot_ids.contiguous(), out)
        return
    grouped_lora_linear(y, x, lora_a, lora_b, slot_ids, out)


def grouped_lora_linear(
    y: torch.Tensor, x: torch.Tensor, lora_a: torch.Tensor, lora_b: torch.Tensor, slot_ids: torch.Tensor,
    out: torch.Tensor,
) -> None:
    """lora_linear in device-agnostic torch: the rows sorted by slot, two fp32 GEMMs for
    each slot the batch uses (one host sync for the group sizes)."""
    out.copy_(y)
    slots = slot_ids.long()
    # One sort instead of a mask per slot: the rows of each slot are then one run.
    order = torch.argsort(slots, stable=True)
    counts = torch.bincount(slots + 1, minlength=lora_a.shape[0] + 1).tolist()
    start = counts[0]  # the rows without an adapter sort first (slot -1)
    for slot, count in enumerate(counts[1:]):
        if count == 0:
            continue
        rows = order[start : start + count]
        start += count
        shrunk = x.index_select(0, rows).float() @ lora_a[slot].float().t()
        delta = shrunk @ lora_b[slot].float()
        out.index_copy_(0, rows, (y.index_select(0, rows).float() + delta).to(out.dtype))
