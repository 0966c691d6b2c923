"""Contract of the group-quantised integer linear (W4A16 / W8A16): y = x @ W^T (+ bias)
with W kept as integer codes and one scale (and zero point) per group of input channels.

The format is data, in one canonical layout that AWQ, GPTQ and compressed-tensors'
`pack-quantized` checkpoints are converted to (or, for compressed-tensors, already are):

- `qweight` int32 [N, cdiv(K * bits, 32)]: each output row's K codes of `bits` bits,
  packed along K, code k at bit `k * bits` of the row's little-endian bit stream (word
  k * bits // 32, shift k * bits % 32): compressed-tensors' `pack_to_int32` layout. The
  codes are unsigned, 0 .. 2**bits - 1; the unused bits of a row's last word are zero.
- `scales` [N, G] fp16/bf16/fp32: the scale of each output row's G groups.
- `zeros` uint8 [N, G], optional: each group's zero point in code units (asymmetric).
  Absent means symmetric, the zero point 2**(bits - 1) (codes are offset-binary).
- `group_size`: input channels per group, -1 for one group a row (per channel). K need
  not be a multiple of it: the last group is partial, so G = cdiv(K, group_size).
- `g_idx` int32 [K], optional (GPTQ's act-order): the group of each input channel, in
  place of k // group_size; G is then the scales' width and every entry lies in [0, G).

w[n, k] = (code[n, k] - zero[n, group(k)]) * scale[n, group(k)].
"""

from __future__ import annotations

from typing import Any, Mapping

import torch

from ..shapes import cdiv
from ..spec import FLOAT_DTYPES, OpContract, ParamSpec, Rule, TensorSpec
from .common import QUANT_ACTIVATIONS, QUANT_BIAS, QUANT_OUT, QUANT_OUT_DTYPE

#: Code widths the contract takes: both pack whole codes into each 32-bit word.
GROUP_QUANT_BITS = (4, 8)
#: group_size's value for one group per output row (per-channel scales).
PER_CHANNEL = -1

#: NMSE bounds against the fp64 reference, by x's dtype. A kernel may dequantise the
#: weight to x's dtype before an fp32-accumulated GEMM: (code - zero) * scale needs up to
#: 9 + 11 bits, so each weight takes one rounding of x's dtype on top of the output's
#: (bf16: about 5e-6 of NMSE each; the cpu kernel measured up to 1.3e-5 on the cases,
#: fp16 ~16x less), while a half-precision running sum measures 3e-4 and fails; fp32
#: holds every weight exactly.
DEQUANTISED_TO_X = {torch.float32: 1e-10, torch.float16: 1e-6, torch.bfloat16: 5e-5}


def packed_words(in_features: int, bits: int) -> int:
    """int32 words of one packed row of `in_features` codes of `bits` bits."""
    return cdiv(in_features * bits, 32)


def group_count(in_features: int, group_size: int) -> int:
    """Groups of one row: cdiv(K, group_size), or 1 per channel."""
    return 1 if group_size == PER_CHANNEL else cdiv(in_features, group_size)


def _packed_rows(call: Mapping[str, Any]) -> tuple[str, str, str] | None:
    depth, bits = call["x"].shape[-1], call["bits"]
    got = call["qweight"].shape[-1]
    if got != packed_words(depth, bits):
        return "qweight", f"{packed_words(depth, bits)} int32 words a row ({depth} {bits}-bit codes)", str(got)
    return None


def _groups(call: Mapping[str, Any]) -> tuple[str, str, str] | None:
    group_size = call["group_size"]
    if group_size != PER_CHANNEL and group_size < 1:
        return "group_size", "a positive group size or -1 (per channel)", str(group_size)
    if call["g_idx"] is not None:
        return None
    depth, got = call["x"].shape[-1], call["scales"].shape[-1]
    if got != group_count(depth, group_size):
        want = group_count(depth, group_size)
        return "scales", f"{want} groups a row (K={depth}, group_size={group_size})", f"{got} columns"
    return None


GROUP_QUANT_LINEAR = OpContract(
    name="group_quant_linear",
    doc=(
        "out = x @ W^T (+ bias), W[n, k] = (code[n, k] - zero[n, g]) * scale[n, g] with g = g_idx[k] where "
        "given, else k // group_size (0 for group_size -1), accumulated in at least fp32 and rounded once to "
        "out_dtype (x's dtype, or fp32 for the LM head). qweight [N, cdiv(K*bits, 32)] int32 packs each row's "
        "unsigned codes along K, code k at bit k*bits of the row (compressed-tensors' pack_to_int32 layout); "
        "zeros absent means symmetric (zero 2**(bits-1)). K need not be a multiple of group_size. A kernel "
        "may dequantise W to x's dtype: the tolerance allows for it."
    ),
    tensors=(
        QUANT_ACTIVATIONS,
        TensorSpec("qweight", (torch.int32,), ("N", "P"), "each output row's codes, packed along K"),
        TensorSpec("scales", FLOAT_DTYPES, ("N", "G"), "each group's scale"),
        TensorSpec("zeros", (torch.uint8,), ("N", "G"), "each group's zero point (asymmetric)", optional=True),
        TensorSpec("g_idx", (torch.int32,), ("K",), "each input channel's group (act-order)", optional=True, index=True),
        QUANT_BIAS,
    ),
    params=(
        ParamSpec("bits", int, choices=GROUP_QUANT_BITS, doc="bits per code"),
        ParamSpec("group_size", int, doc="input channels per group; -1: one group a row"),
        QUANT_OUT_DTYPE,
    ),
    outputs=(QUANT_OUT,),
    primary="x",
    tolerance=DEQUANTISED_TO_X,
    dtype_groups=(("x", "bias"),),
    rules=(
        Rule("qweight holds exactly cdiv(K*bits, 32) words a row", _packed_rows),
        Rule("scales hold one column per group (any number with g_idx)", _groups),
    ),
)

CONTRACTS = (GROUP_QUANT_LINEAR,)


def pack_codes(codes: torch.Tensor, bits: int) -> torch.Tensor:
    """Unsigned codes [rows, K] (any integer dtype, each < 2**bits) as the contract's
    packed int32 rows [rows, cdiv(K*bits, 32)], padding bits zero."""
    per_word = 32 // bits
    rows, depth = codes.shape
    padded = torch.nn.functional.pad(codes.long(), (0, packed_words(depth, bits) * per_word - depth))
    shifts = torch.arange(per_word, device=codes.device) * bits
    words = (padded.view(rows, -1, per_word) << shifts).sum(-1)
    # Words are assembled as unsigned 32-bit values; int32 holds the same bits.
    return torch.where(words >= 2**31, words - 2**32, words).to(torch.int32)


def unpack_codes(words: torch.Tensor, bits: int, in_features: int) -> torch.Tensor:
    """The unsigned codes [rows, K] (uint8) of packed int32 rows [rows, P], read through
    a uint8 view of the words: a 4-bit code k is byte k // 2's low nibble for even k,
    its high one for odd k, which is bit k * 4 of the row's little-endian bit stream
    (every host torch's CPU build runs on is little-endian)."""
    packed = words.contiguous().view(torch.uint8)
    if bits == 8:
        return packed[:, :in_features]
    return torch.stack((packed & 0xF, packed >> 4), dim=-1).view(words.shape[0], -1)[:, :in_features]
