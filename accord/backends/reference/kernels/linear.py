"""Reference dense GEMM: fp64 accumulation, rounded once."""

from __future__ import annotations

import torch

from ._registry import KERNELS


@KERNELS.register("linear")
def linear(
    x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None, out_dtype: torch.dtype | None, out: torch.Tensor
) -> None:
    """out = x @ weight^T (+ bias) in fp64, rounded once to out's dtype (out_dtype's)."""
    result = x.double() @ weight.double().t()
    if bias is not None:
        result += bias.double()
    out.copy_(result)
