"""Dense GEMM on oneDNN with weights prepacked once at load, and bf16 weight streaming
for decode row counts on AVX512 CPUs.

Measured on a 2-core AVX512F Xeon (no AVX512-BF16/AMX; `benchmarks/linear_cpu.py`, the
152M Llama's projections, fp32): oneDNN's prepacked blocked weights beat `F.linear` on a
plain [N, K] weight by 1.3-1.5x from 4 rows up and tie it at one row (where the weights
stream at memory bandwidth either way); MKL's packed GEMM is packed for one batch size
only. So weights whose dtype the CPU computes natively (`work_dtype`: fp32 everywhere,
bf16/fp16 with AVX512-BF16 or AMX) are reordered into oneDNN's layout; anything else
keeps its plain layout and is computed in fp32.

A bf16 checkpoint on a CPU without native bf16 runs in fp32, so its weights arrive here
as fp32 values that are exactly bf16. At a few rows the GEMM is bound by streaming the
weights, so such a weight also keeps a bf16 copy (`BF16_COPY`, half the bytes) that the
bf16-weight GEMM of `_native_gemm` widens back to fp32 exactly inside its loop: fp32
activations, fp32 accumulation, the fp32 path's numerics at about 1.3-2x its speed for
1-4 rows on AVX512. Built for AVX2 only (-march=haswell, against oneDNN held to AVX2 by
ONEDNN_MAX_CPU_ISA) it tied oneDNN's fp32 at one row and lost 2-10x from two, so AVX2
CPUs keep the fp32 path (`BF16_WEIGHT_CAPABILITIES`). From `BF16_WEIGHT_MAX_ROWS + 1`
rows the GEMM is compute-bound and oneDNN's fp32 kernel on the prepacked weight is up
to 2x faster than the bf16-weight one, so the prepacked fp32 form stays: the two forms
cost 1.5x the fp32 weight memory (6 bytes per parameter instead of 4). oneDNN's own bf16
GEMM is no substitute: it rounds the fp32 activations to bf16 and is 2-3x slower than
fp32 from 2 rows up without native bf16.

On a CPU with native bf16 (AVX512-BF16 or AMX) a bf16 checkpoint computes in bf16: its
weights are prepacked as bf16 for oneDNN, and on AVX512 each also keeps the same packed
bf16 copy, which the bf16-weight GEMM runs on bf16 activations (widened exactly, fp32
accumulation, rounded once to bf16: oneDNN's bf16 numerics) for up to
`BF16_WEIGHT_MAX_ROWS` rows. Not for speed measured there (no such host was at hand; the
copy streams as fast as the fp32-activation path does here, `benchmarks/` has no
native-bf16 figure): it makes every op of a few-rows decode step a native call, so the
cpu backend captures the step as a graph (`max_graph_batch`; on the fp32 path here the
152M Llama's batch-1 decode took 23.5 ms/token replayed against 32.5 eager). The cost:
both forms, 4 bytes per parameter instead of 2 (twice the bf16 weight memory).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from . import _native_gemm
from ._precision import work_dtype
from ._registry import KERNELS

#: The attribute of a prepacked weight (fp32 or bf16) holding its exact bf16 copy (a
#: `_native_gemm.Bf16Weight`).
BF16_COPY = "accord_bf16_copy"
#: The most rows the bf16 copy serves: the crossover measured by benchmarks/linear_cpu.py
#: on the 152M model's projections (the bf16-weight GEMM wins at 1, 2 and 4 rows, ties
#: or loses at 8, loses 1.5-2x from 16).
BF16_WEIGHT_MAX_ROWS = 4
#: torch's CPU capabilities (`torch.backends.cpu.get_cpu_capability()`) the bf16-weight
#: GEMM was measured faster on.
BF16_WEIGHT_CAPABILITIES = ("AVX512",)


def prepack(weight: torch.Tensor) -> torch.Tensor:
    """`weight` [N, K] in oneDNN's blocked layout (an opaque mkldnn tensor of the same
    logical shape and dtype) when oneDNN computes its dtype natively here, else as is;
    a bf16 weight, and an fp32 weight whose values are all exactly bf16 (a bf16
    checkpoint computed in fp32), also carry their bf16 copy as `BF16_COPY`, for the
    few-rows path, where `streams_bf16_weights()`."""
    if (
        weight.device.type != "cpu"
        or weight.is_mkldnn
        or not torch.backends.mkldnn.is_available()
        or work_dtype(weight.dtype) != weight.dtype
        or not _onednn_computes(weight.dtype)
    ):
        return weight
    weight = weight.contiguous()
    packed = torch.ops.mkldnn._reorder_linear_weight(weight)
    copy = _bf16_copy(weight)
    if copy is not None:
        setattr(packed, BF16_COPY, copy)
    return packed


def _onednn_computes(dtype: torch.dtype) -> bool:
    """Whether oneDNN's reorder and GEMM take `dtype` on this CPU. Its half types need
    AVX512 (bf16) or AVX512-FP16 (fp16): AVX512-BF16 CPUs without AVX512-FP16 (AMD's)
    compute fp16 in torch, and an AVX2 CPU forced onto the native-bf16 path computes
    bf16 in torch."""
    if dtype == torch.bfloat16:
        return torch.ops.mkldnn._is_mkldnn_bf16_supported()
    if dtype == torch.float16:
        return torch.ops.mkldnn._is_mkldnn_fp16_supported()
    return True


def streams_bf16_weights() -> bool:
    """Whether this host keeps bf16 copies of bf16(-valued) weights for few rows: an
    AVX512 CPU with oneDNN and the bf16-weight GEMM built, whether it computes bf16 in
    fp32 (the copies of exactly-bf16 fp32 weights) or natively (of bf16 weights)."""
    return (
        torch.backends.mkldnn.is_available()
        and torch.backends.cpu.get_cpu_capability() in BF16_WEIGHT_CAPABILITIES
        and _native_gemm.available()
    )


def _bf16_copy(weight: torch.Tensor) -> _native_gemm.Bf16Weight | None:
    """The bf16 copy of a bf16 weight, or of an fp32 weight that loses nothing by it,
    where it pays; else None."""
    if weight.dtype not in (torch.float32, torch.bfloat16) or not streams_bf16_weights():
        return None
    if weight.dtype == torch.bfloat16:
        return _native_gemm.bf16_weight(weight)
    return _native_gemm.exact_bf16(weight)


@KERNELS.register("linear")
def linear(
    x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None, out_dtype: torch.dtype | None, out: torch.Tensor
) -> None:
    """y = x @ W^T (+ bias): the bf16 copy streamed for few rows, else oneDNN on a
    prepacked weight, else torch's GEMM in the work dtype (fp32 for bf16/fp16 without
    native support), rounded once into out. An fp32 out from half x (out_dtype: the LM
    head's logits) is never rounded to the half dtype on the way: the bf16 copy serves it
    at every row count (its sum is fp32; oneDNN's bf16 GEMM rounds its result), and a
    weight without one is computed in fp32."""
    widened = out.dtype != x.dtype
    if weight.is_mkldnn:
        streamed = getattr(weight, BF16_COPY, None)
        if streamed is not None and (widened or x.shape[0] <= BF16_WEIGHT_MAX_ROWS) and out.stride(1) == 1:
            # x and the weight share a logical dtype (the contract's dtype group): fp32,
            # or bf16 where the CPU computes it natively, both of which the C kernel
            # takes, and a bias in out's dtype; it wants unit column strides and a
            # contiguous bias.
            if bias is not None:
                bias = bias.to(out.dtype).contiguous()
            streamed(x if x.stride(1) == 1 else x.contiguous(), bias, out)
            return
        if not widened:
            # oneDNN's linear has no out= form; the copy is T*N elements, small beside the GEMM.
            out.copy_(torch.ops.mkldnn._linear_pointwise(x, weight, bias, "none", [], ""))
            return
        weight = weight.to_dense()
    compute = out.dtype if widened else work_dtype(x.dtype)
    if x.dtype != compute:
        x, weight, bias = x.to(compute), weight.to(compute), None if bias is None else bias.to(compute)
    if compute != out.dtype:
        out.copy_(F.linear(x, weight, bias))
    elif bias is None:
        torch.mm(x, weight.t(), out=out)
    else:
        torch.addmm(bias, x, weight.t(), out=out)
