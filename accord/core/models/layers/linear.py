"""Linear layers as the graphs see them: anything callable on [T, K] activations that
knows its output width. Dense GEMMs are plain torch (not a contract op); fp8 ones live in
accord.core.quantization and go through ops.quantize_fp8 + ops.scaled_mm."""

from __future__ import annotations

from typing import Protocol

import torch
import torch.nn.functional as F


class Linear(Protocol):
    """What a graph calls: y [T, N] = linear(x [T, K])."""

    out_features: int

    def __call__(self, x: torch.Tensor) -> torch.Tensor: ...


class DenseLinear:
    """y = x @ W^T (+ bias) in the weight's dtype."""

    def __init__(self, weight: torch.Tensor, bias: torch.Tensor | None = None) -> None:
        self.weight = weight
        self.bias = bias
        self.out_features = weight.shape[0]

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        return F.linear(x, self.weight, self.bias)
