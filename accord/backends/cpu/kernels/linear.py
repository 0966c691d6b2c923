"""Dense GEMM on oneDNN with weights prepacked once at load.

Measured on a 2-core AVX512F Xeon (no AVX512-BF16/AMX; `benchmarks/linear_cpu.py`, the
152M Llama's projections, fp32): oneDNN's prepacked blocked weights beat `F.linear` on a
plain [N, K] weight by 1.3-1.5x from 4 rows up and tie it at one row (where the weights
stream at memory bandwidth either way); MKL's packed GEMM is packed for one batch size
only. So weights whose dtype the CPU computes natively (`work_dtype`: fp32 everywhere,
bf16/fp16 with AVX512-BF16 or AMX) are reordered into oneDNN's layout; anything else
keeps its plain layout and is computed in fp32.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from ._precision import work_dtype
from ._registry import KERNELS


def prepack(weight: torch.Tensor) -> torch.Tensor:
    """`weight` [N, K] in oneDNN's blocked layout (an opaque mkldnn tensor of the same
    logical shape and dtype) when oneDNN computes its dtype natively here; else as is."""
    if (
        weight.device.type != "cpu"
        or weight.is_mkldnn
        or not torch.backends.mkldnn.is_available()
        or work_dtype(weight.dtype) != weight.dtype
    ):
        return weight
    return torch.ops.mkldnn._reorder_linear_weight(weight.contiguous())


@KERNELS.register("linear")
def linear(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None, out: torch.Tensor) -> None:
    """y = x @ W^T (+ bias): oneDNN on a prepacked weight, else torch's GEMM in the
    work dtype (fp32 for bf16/fp16 without native support), rounded once into out."""
    if weight.is_mkldnn:
        # oneDNN's linear has no out= form; the copy is T*N elements, small beside the GEMM.
        out.copy_(torch.ops.mkldnn._linear_pointwise(x, weight, bias, "none", [], ""))
        return
    compute = work_dtype(x.dtype)
    if compute == out.dtype:
        if bias is None:
            torch.mm(x, weight.t(), out=out)
        else:
            torch.addmm(bias, x, weight.t(), out=out)
        return
    out.copy_(F.linear(x.to(compute), weight.to(compute), None if bias is None else bias.to(compute)))
