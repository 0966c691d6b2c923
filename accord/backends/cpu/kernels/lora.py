"""Multi-LoRA on the CPU, SGMV-style: the rows are grouped by adapter slot and each
slot present runs two small fp32 GEMMs over its rows (shrink to the rank, expand back),
so the cost is that of the adapters the batch really uses, never of every slot.
Device-agnostic torch, so other backends may register it as their own."""

from __future__ import annotations

import torch

from ._registry import KERNELS


@KERNELS.register("lora_linear")
def lora_linear(
    y: torch.Tensor, x: torch.Tensor, lora_a: torch.Tensor, lora_b: torch.Tensor, slot_ids: torch.Tensor,
    out: torch.Tensor,
) -> None:
    """out = y, plus x @ A[s]^T @ B[s]^T in fp32 on the rows of each slot s the batch names."""
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
        delta = shrunk @ lora_b[slot].float().t()
        out.index_copy_(0, rows, (y.index_select(0, rows).float() + delta).to(out.dtype))
