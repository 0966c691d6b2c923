"""Linear layers as the graphs see them: anything callable on [T, K] activations that
knows its output width. Dense GEMMs go through ops.linear on a weight the backend
prepared once at load; fp8 ones live in accord.core.quantization and go through
ops.quantize_fp8 + ops.scaled_mm."""

from __future__ import annotations

from typing import Protocol

import torch

from ....op_contracts import OpDispatcher


class Linear(Protocol):
    """What a graph calls: y [T, N] = linear(x [T, K])."""

    out_features: int

    def __call__(self, x: torch.Tensor) -> torch.Tensor: ...


class DenseLinear:
    """y = x @ W^T (+ bias) in the weight's dtype, or in fp32 where `out_dtype` says so
    (the LM head), through the `linear` contract. The weight is handed to the backend
    once (`prepare_linear_weight`), which may repack it into its GEMM library's layout;
    the layer keeps only that form."""

    def __init__(
        self, ops: OpDispatcher, weight: torch.Tensor, bias: torch.Tensor | None = None,
        out_dtype: torch.dtype | None = None,
    ) -> None:
        self.ops = ops
        self.weight = ops.prepare_linear_weight(weight)
        self.bias = bias
        self.out_dtype = out_dtype
        self.out_features = weight.shape[0]

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        return self.ops.linear(x, self.weight, self.bias, self.out_dtype)
