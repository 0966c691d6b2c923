"""Contract of batched multi-LoRA (Punica's BGMV/SGMV, S-LoRA): every token of one
batch adds the low-rank delta of its own adapter to the base projection's output. The
base GEMM runs once for the whole batch (the `linear` op); this op adds each row's
delta, reading that row's adapter slot from an int32 index (-1: no adapter)."""

from __future__ import annotations

import torch

from ..spec import FLOAT_DTYPES, OpContract, OutputSpec, TensorSpec
from .common import REDUCTION

LORA_LINEAR = OpContract(
    name="lora_linear",
    doc=(
        "out[t] = y[t] + (x[t] @ lora_a[s]^T) @ lora_b[s] with s = slot_ids[t], and "
        "out[t] = y[t] where s = -1 (the base model). `y` is the base projection of `x` "
        "(ops.linear, once for the batch); `lora_a` [S, R, K] (PEFT's A) and `lora_b` "
        "[S, R, N] (PEFT's B transposed, so the expand reads each rank's row of N outputs "
        "contiguously) hold the adapters resident in the S device slots, padded with zeros "
        "to the slots' rank R, the adapter's scaling already folded into lora_b. A slot no row names may hold "
        "anything. Both products are accumulated in at least fp32 and the sum with y is "
        "rounded once to y's dtype. slot_ids values lie in [-1, S)."
    ),
    tensors=(
        TensorSpec("y", FLOAT_DTYPES, ("T", "N"), "the base projection's output"),
        TensorSpec("x", FLOAT_DTYPES, ("T", "K"), "the projection's input activations", contiguous=False),
        TensorSpec("lora_a", FLOAT_DTYPES, ("S", "R", "K"), "each slot's A (down) matrix"),
        TensorSpec("lora_b", FLOAT_DTYPES, ("S", "R", "N"), "each slot's B (up) matrix transposed, times the scaling"),
        TensorSpec("slot_ids", (torch.int32,), ("T",), "each token's adapter slot, -1 for none", index=True),
    ),
    params=(),
    outputs=(OutputSpec("out", ("T", "N"), "like:y"),),
    primary="y",
    tolerance=REDUCTION,
    dtype_groups=(("y", "x", "lora_a", "lora_b"),),
)

CONTRACTS = (LORA_LINEAR,)
