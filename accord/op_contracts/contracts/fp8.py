"""Contracts of FP8 quantisation and the scaled matmul.

Scales are always fp32 and always rank 2, so one shape rule covers every granularity:
per tensor (1, 1), per row (M, 1) / per output column (N, 1), and DeepSeek's blocks,
1x128 groups for activations and 128x128 tiles for weights. Dequantised value =
stored fp8 value * scale. Both fp8 flavours are legal; e4m3fnuz (MI300-class) has a
smaller range (240 against 448), and a call's two operands must share one flavour.
"""

from __future__ import annotations

from typing import Any, Mapping

import torch

from ..spec import FLOAT_DTYPES, FP8_DTYPES, Dequantised, OpContract, OutputSpec, ParamSpec, Rule, Switch, TensorSpec
from .common import ELEMENTWISE, FP32_ACCUMULATED, QUANTISED, UNBIASED_CODES

GROUP = 128


def _static_scale_per_tensor(call: Mapping[str, Any]) -> tuple[str, str, str] | None:
    if call["scale"] is not None and call["mode"] != "per_tensor":
        return "scale", "absent unless mode is per_tensor (static scales are per tensor)", "a tensor"
    if call["mode"] == "per_group" and call["group_size"] != GROUP:
        return "group_size", str(GROUP), str(call["group_size"])
    return None


QUANTIZE_FP8 = OpContract(
    name="quantize_fp8",
    doc=(
        "scales = max(amax(|x|) over the granule, 1e-10) / FP8_MAX[fp8_dtype] in fp32 "
        "(granule: the whole tensor, each row, or each 128-wide group of a row), or the "
        "given static per-tensor scale; q = clamp(x / scale, -FP8_MAX, FP8_MAX) rounded "
        "to nearest fp8 (computed in fp32, rounded once)."
    ),
    tensors=(
        TensorSpec("x", FLOAT_DTYPES, ("T", "H")),
        TensorSpec("scale", (torch.float32,), ("1", "1"), "static per-tensor scale", optional=True),
    ),
    params=(
        ParamSpec("mode", str, "per_token", choices=("per_tensor", "per_token", "per_group")),
        ParamSpec("group_size", int, GROUP),
        ParamSpec("fp8_dtype", torch.dtype, torch.float8_e4m3fn, choices=FP8_DTYPES),
    ),
    outputs=(
        OutputSpec("q", ("T", "H"), "param:fp8_dtype"),
        OutputSpec(
            "scales",
            Switch("mode", {"per_tensor": ("1", "1"), "per_token": ("T", "1"), "per_group": ("T", "cdiv(H,group_size)")}),
            torch.float32,
        ),
    ),
    primary="x",
    tolerance=ELEMENTWISE | {torch.float8_e4m3fn: 2e-3},
    ulps=QUANTISED,
    rounding_bias=UNBIASED_CODES,
    dequantised=Dequantised("q", "scales", "group_size"),
    rules=(Rule("static scales are per tensor; groups are 128 wide", _static_scale_per_tensor),),
)

SCALED_MM = OpContract(
    name="scaled_mm",
    doc=(
        "out = (a * a_scale) @ (b * b_scale)^T (+ bias), a as activations [M, K] and b "
        "as a weight [N, K] like F.linear, accumulated in fp32 and rounded once to "
        "out_dtype. scale_mode 'tensor': both scales (1, 1); 'row': a_scale (M, 1) per "
        "token and b_scale (N, 1) per output channel; 'block': a_scale (M, K/128) per "
        "1x128 group and b_scale (N/128, K/128) per 128x128 tile."
    ),
    tensors=(
        TensorSpec("a", FP8_DTYPES, ("M", "K")),
        TensorSpec("b", FP8_DTYPES, ("N", "K")),
        TensorSpec(
            "a_scale",
            (torch.float32,),
            Switch("scale_mode", {"tensor": ("1", "1"), "row": ("M", "1"), "block": ("M", "cdiv(K,128)")}),
        ),
        TensorSpec(
            "b_scale",
            (torch.float32,),
            Switch("scale_mode", {"tensor": ("1", "1"), "row": ("N", "1"), "block": ("cdiv(N,128)", "cdiv(K,128)")}),
        ),
        TensorSpec("bias", FLOAT_DTYPES, ("N",), optional=True),
    ),
    params=(
        ParamSpec("scale_mode", str, "tensor", choices=("tensor", "row", "block")),
        ParamSpec("out_dtype", torch.dtype, torch.bfloat16, choices=FLOAT_DTYPES),
    ),
    outputs=(OutputSpec("out", ("M", "N"), "param:out_dtype"),),
    primary="a",
    tolerance=FP32_ACCUMULATED,
    tolerance_key="out",
    dtype_groups=(("a", "b"),),
)

CONTRACTS = (QUANTIZE_FP8, SCALED_MM)
