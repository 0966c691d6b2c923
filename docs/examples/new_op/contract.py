"""The worked example of docs/plugin_authoring.md ("Adding an op"), file 1 of 3: the
contract. In the tree it joins accord/op_contracts/contracts/elementwise.py (appended
to that module's CONTRACTS tuple)."""

from __future__ import annotations

from accord.op_contracts import FLOAT_DTYPES, OpContract, OutputSpec, TensorSpec
from accord.op_contracts.contracts.common import ELEMENTWISE, ROUNDED_ONCE

GELU_AND_MUL = OpContract(
    name="gelu_and_mul",
    doc=(
        "out = gelu_tanh(x[:, :I]) * x[:, I:], gelu_tanh(g) = 0.5 g (1 + tanh(sqrt(2/pi) (g + 0.044715 g^3))), "
        "computed in fp32 and rounded once (GeGLU, Gemma's gated MLP)."
    ),
    tensors=(TensorSpec("x", FLOAT_DTYPES, ("T", "2*I"), "gate and up projections side by side"),),
    params=(),
    outputs=(OutputSpec("out", ("T", "I"), "like:x"),),
    primary="x",
    tolerance=ELEMENTWISE,
    ulps=ROUNDED_ONCE,
)

CONTRACTS = (GELU_AND_MUL,)
