"""Contract of the dense GEMM every projection runs: y = x @ W^T (+ bias)."""

from __future__ import annotations

from ..spec import FLOAT_DTYPES, OpContract, OutputSpec, TensorSpec
from .common import REDUCTION

LINEAR = OpContract(
    name="linear",
    doc=(
        "out = x @ weight^T (+ bias), accumulated in at least fp32 and rounded once to "
        "x's dtype. `weight` is what Backend.prepare_linear_weight returned at load: the "
        "backend may hold it in an opaque, prepacked layout (oneDNN's blocked format on "
        "CPUs), so only the backend that prepared a weight may be handed it; its logical "
        "shape and dtype are those of the [N, K] checkpoint matrix."
    ),
    tensors=(
        TensorSpec("x", FLOAT_DTYPES, ("T", "K"), "activations, one row per token", contiguous=False),
        TensorSpec("weight", FLOAT_DTYPES, ("N", "K"), "the weight, as the backend prepared it"),
        TensorSpec("bias", FLOAT_DTYPES, ("N",), "per-output-channel bias", optional=True),
    ),
    params=(),
    outputs=(OutputSpec("out", ("T", "N"), "like:x"),),
    primary="x",
    tolerance=REDUCTION,
    dtype_groups=(("x", "weight", "bias"),),
)

CONTRACTS = (LINEAR,)
