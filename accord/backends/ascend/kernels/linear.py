"""The dense GEMM: aten's linear on the NPU, which torch-npu runs on CANN's MatMul.
npu_linear documents fp16/fp32/int8 only (no bf16), so the plain aten op is the one
that covers the contract's dtypes; weights stay in their [N, K] checkpoint layout."""

from __future__ import annotations

import torch
import torch.nn.functional as F

from ....op_contracts import KernelSet


def linear(
    x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None, out_dtype: torch.dtype | None, out: torch.Tensor
) -> None:
    """out = x @ weight^T (+ bias). An fp32 out from half operands (the LM head's logits)
    is computed on fp32 copies: aten's half linear rounds its result to the half dtype."""
    if out.dtype != x.dtype:
        x, weight, bias = x.float(), weight.float(), None if bias is None else bias.float()
    out.copy_(F.linear(x, weight, bias))


def register(kernels: KernelSet) -> None:
    """Add the GEMM (it calls no npu_* operator)."""
    kernels.register("linear")(linear)
