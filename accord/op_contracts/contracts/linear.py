"""Contract of the dense GEMM every projection runs: y = x @ W^T (+ bias)."""

from __future__ import annotations

import torch

from ..spec import FLOAT_DTYPES, OpContract, OutputSpec, ParamSpec, TensorSpec
from .common import FP32_ACCUMULATED

LINEAR = OpContract(
    name="linear",
    doc=(
        "out = x @ weight^T (+ bias), accumulated in at least fp32 and rounded once to "
        "out_dtype: x's dtype, or fp32 from bf16/fp16 operands (the LM head's logits, which "
        "sampling, logprobs and token masks read, so a half-precision rounding never ties "
        "two tokens). `weight` is what Backend.prepare_linear_weight returned at load: the "
        "backend may hold it in an opaque, prepacked layout (oneDNN's blocked format on "
        "CPUs), so only the backend that prepared a weight may be handed it; its logical "
        "shape and dtype are those of the [N, K] checkpoint matrix."
    ),
    tensors=(
        TensorSpec("x", FLOAT_DTYPES, ("T", "K"), "activations, one row per token", contiguous=False),
        TensorSpec("weight", FLOAT_DTYPES, ("N", "K"), "the weight, as the backend prepared it"),
        TensorSpec("bias", FLOAT_DTYPES, ("N",), "per-output-channel bias", optional=True),
    ),
    params=(
        ParamSpec("out_dtype", torch.dtype, None, choices=(None, torch.float32), doc="the output's, where not x's"),
    ),
    outputs=(OutputSpec("out", ("T", "N"), "param:out_dtype|like:x"),),
    primary="x",
    # The contract's fp32 accumulation, rounded once, judged as such: a half-precision
    # running sum passes a GEMM's REDUCTION bound (bf16 1e-3) even at K = 2880 (measured
    # 3e-4), while a correct kernel differs from the reference only at rounding
    # midpoints (cpu measured: bf16 0, fp16 3e-11, fp32 3e-13). A backend whose GEMM
    # accumulates otherwise (TF32) declares a tolerance override.
    tolerance=FP32_ACCUMULATED,
    # An fp32 output from half operands is an fp32 sum of exact products: judged at fp32.
    tolerance_key="out",
    dtype_groups=(("x", "weight", "bias"),),
)

CONTRACTS = (LINEAR,)
