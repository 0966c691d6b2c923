"""RMS norm through `ops.rms_norm`, or `ops.fused_add_rms_norm` when a residual comes."""

from __future__ import annotations

import torch

from ....op_contracts import OpDispatcher


class RMSNorm:
    """Llama's RMSNorm; called with a residual it adds first and returns the new residual."""

    def __init__(self, ops: OpDispatcher, weight: torch.Tensor, eps: float) -> None:
        self.ops = ops
        self.weight = weight
        self.eps = eps

    def __call__(
        self, x: torch.Tensor, residual: torch.Tensor | None = None
    ) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:
        """norm(x) [T, H]; or (norm(x + residual), x + residual) when residual is given."""
        if residual is None:
            return self.ops.rms_norm(x, self.weight, eps=self.eps)
        return self.ops.fused_add_rms_norm(x, residual, self.weight, eps=self.eps)
