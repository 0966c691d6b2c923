"""Reference multi-LoRA delta: each row's adapter applied on its own, in fp64."""

from __future__ import annotations

import torch

from ._registry import KERNELS


@KERNELS.register("lora_linear")
def lora_linear(
    y: torch.Tensor, x: torch.Tensor, lora_a: torch.Tensor, lora_b: torch.Tensor, slot_ids: torch.Tensor,
    out: torch.Tensor,
) -> None:
    """Row by row: y + x @ A[s]^T @ B[s] in fp64 (y where s = -1), rounded once."""
    result = y.double()
    for row, slot in enumerate(slot_ids.tolist()):
        if slot >= 0:
            result[row] += (x[row].double() @ lora_a[slot].double().t()) @ lora_b[slot].double()
    out.copy_(result)
