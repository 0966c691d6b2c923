"""Contracts of the GGUF block formats: the quantised linear, y = x @ dequantise(qweight)^T
(+ bias), and the quantised embedding lookup, out = dequantise(qweight)[ids], each with
the weight kept in the block format it was stored in.

The format is data: `quant_type` names a GGUF block format (`GGUF_FORMATS`: weights per
block, bytes per block), and `qweight` holds each output row's blocks, byte for byte as
ggml lays them out (`block_q4_0`: an fp16 scale, then 16 bytes of 4-bit codes), so the
scales, mins and high bits travel inside each block as the file stores them and a
GGUF tensor is handed over without repacking. A row of K weights is K / block_size
blocks, so K must be a whole number of blocks.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Mapping

import torch

from ..spec import FLOAT_DTYPES, INDEX_DTYPES, OpContract, OutputSpec, ParamSpec, Rule, TensorSpec
from .common import ELEMENTWISE, QUANT_ACTIVATIONS, QUANT_BIAS, QUANT_OUT, QUANT_OUT_DTYPE


@dataclass(frozen=True)
class BlockFormat:
    """One GGUF block format: `block_size` weights are stored in `block_bytes` bytes,
    with fp16 fields (the block's scale d, and its min where it has one) at the byte
    offsets `fp16_fields`; every other byte is codes, sub-block scales or high bits."""

    name: str
    block_size: int
    block_bytes: int
    fp16_fields: tuple[int, ...]

    def row_bytes(self, in_features: int) -> int:
        """Bytes of one packed row of `in_features` weights (a whole number of blocks)."""
        return in_features // self.block_size * self.block_bytes


#: The block formats llama.cpp's common presets write (ggml-common.h's block structs):
#: the legacy 32-weight formats and the 256-weight k-quants.
GGUF_FORMATS: Mapping[str, BlockFormat] = {
    fmt.name: fmt
    for fmt in (
        BlockFormat("Q8_0", 32, 34, (0,)),
        BlockFormat("Q4_0", 32, 18, (0,)),
        BlockFormat("Q4_1", 32, 20, (0, 2)),
        BlockFormat("Q5_0", 32, 22, (0,)),
        BlockFormat("Q5_1", 32, 24, (0, 2)),
        BlockFormat("Q2_K", 256, 84, (80, 82)),
        BlockFormat("Q3_K", 256, 110, (108,)),
        BlockFormat("Q4_K", 256, 144, (0, 2)),
        BlockFormat("Q5_K", 256, 176, (0, 2)),
        BlockFormat("Q6_K", 256, 210, (208,)),
    )
}

#: NMSE bounds against the fp64 reference, by the output's dtype. A kernel may quantise
#: the activations to int8 per 32-wide block, as ggml's dot products do (x's step is
#: amax/127, so Gaussian activations carry an NMSE near 3e-5 into the output); half
#: outputs add their own rounding on top.
QUANTISED_ACTIVATIONS = {torch.float32: 2e-4, torch.float16: 2e-4, torch.bfloat16: 1e-3}


def _whole_blocks_of(
    depth: int, argument: str, symbol: str, call: Mapping[str, Any]
) -> tuple[str, str, str] | None:
    """None when `depth` weights a row (`symbol`, given by `argument`) are whole blocks
    of the call's format and qweight holds exactly those blocks a row; else the violation."""
    fmt = GGUF_FORMATS[call["quant_type"]]
    if depth % fmt.block_size:
        return argument, f"{symbol} a multiple of {fmt.block_size} ({fmt.name}'s block)", f"{symbol}={depth}"
    got = call["qweight"].shape[-1]
    if got != fmt.row_bytes(depth):
        return "qweight", f"{fmt.row_bytes(depth)} bytes a row ({depth // fmt.block_size} {fmt.name} blocks)", str(got)
    return None


#: The packed weight both ops take, and its format.
QUANT_WEIGHT_ROWS = "each row's GGUF blocks, as ggml lays them out"
QUANT_FORMAT = ParamSpec("quant_type", str, choices=tuple(GGUF_FORMATS), doc="the GGUF block format")

QUANT_LINEAR = OpContract(
    name="quant_linear",
    doc=(
        "out = x @ dequantise(qweight, quant_type)^T (+ bias), accumulated in at least "
        "fp32 and rounded once to out_dtype (x's dtype, or fp32 for the LM head). qweight "
        "[N, K / block_size * block_bytes] holds each output row's GGUF blocks as ggml "
        "lays them out; dequantise is the format's definition (ggml-quants.c's "
        "dequantize_row_*). A kernel may quantise x to int8 per 32-wide block (ggml's "
        "Q8 activations): the tolerance allows for it."
    ),
    tensors=(
        QUANT_ACTIVATIONS,
        TensorSpec("qweight", (torch.uint8,), ("N", "B"), QUANT_WEIGHT_ROWS),
        QUANT_BIAS,
    ),
    params=(
        QUANT_FORMAT,
        QUANT_OUT_DTYPE,
    ),
    outputs=(QUANT_OUT,),
    primary="x",
    tolerance=QUANTISED_ACTIVATIONS,
    tolerance_key="out",
    dtype_groups=(("x", "bias"),),
    rules=(
        Rule(
            "K is a whole number of blocks; qweight holds exactly those blocks",
            lambda call: _whole_blocks_of(call["x"].shape[-1], "x", "K", call),
        ),
    ),
)

QUANT_EMBEDDING = OpContract(
    name="quant_embedding",
    doc=(
        "out[t] = dequantise(qweight[ids[t]], quant_type), each looked-up row "
        "dequantised by its format's definition (as quant_linear's) and rounded once "
        "to out_dtype: a GGUF token embedding read in its blocks, so a model whose "
        "LM head shares the table holds it once. Every id must name a row of qweight."
    ),
    tensors=(
        TensorSpec("ids", INDEX_DTYPES, ("T",), "token ids, rows of qweight", index=True),
        TensorSpec("qweight", (torch.uint8,), ("V", "B"), QUANT_WEIGHT_ROWS),
    ),
    params=(
        QUANT_FORMAT,
        ParamSpec("hidden_size", int, doc="weights a row (a whole number of blocks)"),
        ParamSpec("out_dtype", torch.dtype, choices=FLOAT_DTYPES, doc="the rows' dtype"),
    ),
    outputs=(OutputSpec("out", ("T", "hidden_size"), "param:out_dtype"),),
    primary="ids",
    tolerance=ELEMENTWISE,
    tolerance_key="out",
    rules=(
        Rule(
            "hidden_size is a whole number of blocks; qweight holds exactly those blocks",
            lambda call: _whole_blocks_of(call["hidden_size"], "hidden_size", "hidden_size", call),
        ),
    ),
)

CONTRACTS = (QUANT_LINEAR, QUANT_EMBEDDING)
