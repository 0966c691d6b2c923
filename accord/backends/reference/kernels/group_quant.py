"""Reference group-quantised linear: every weight dequantised in fp64 from the format's
definition (code k of a row at bit k * bits of its packed words; w = (code - zero) *
scale of the channel's group), then an fp64 GEMM rounded once."""

from __future__ import annotations

import torch

from ....op_contracts import PER_CHANNEL
from ._registry import KERNELS


def codes(qweight: torch.Tensor, bits: int, in_features: int) -> torch.Tensor:
    """The unsigned codes [N, K] (int64) of packed rows: code k is bits [k*bits, k*bits
    + bits) of the row, word k*bits // 32 at shift k*bits % 32."""
    position = torch.arange(in_features, device=qweight.device) * bits
    # int32 words read as unsigned 32-bit values, so a code in the sign bit stays whole.
    words = qweight.long() & 0xFFFFFFFF
    return (words[:, position // 32] >> (position % 32)) & ((1 << bits) - 1)


def channel_groups(
    in_features: int, group_size: int, g_idx: torch.Tensor | None, device: torch.device
) -> torch.Tensor:
    """The group [K] of each input channel: g_idx where given, else k // group_size."""
    if g_idx is not None:
        return g_idx.long()
    channels = torch.arange(in_features, device=device)
    return torch.zeros_like(channels) if group_size == PER_CHANNEL else channels // group_size


def dequantize(
    qweight: torch.Tensor, scales: torch.Tensor, zeros: torch.Tensor | None, g_idx: torch.Tensor | None,
    bits: int, group_size: int, in_features: int,
) -> torch.Tensor:
    """The weight [N, K] in fp64: (code - zero) * scale, per channel's group."""
    group = channel_groups(in_features, group_size, g_idx, qweight.device)
    zero = zeros.double()[:, group] if zeros is not None else float(1 << (bits - 1))
    return (codes(qweight, bits, in_features).double() - zero) * scales.double()[:, group]


@KERNELS.register("group_quant_linear")
def group_quant_linear(
    x: torch.Tensor, qweight: torch.Tensor, scales: torch.Tensor, zeros: torch.Tensor | None, g_idx: torch.Tensor | None,
    bias: torch.Tensor | None, bits: int, group_size: int, out_dtype: torch.dtype | None, out: torch.Tensor,
) -> None:
    """out = x @ dequantise(qweight)^T (+ bias) in fp64, rounded once."""
    weight = dequantize(qweight, scales, zeros, g_idx, bits, group_size, x.shape[1])
    result = x.double() @ weight.t()
    if bias is not None:
        result += bias.double()
    out.copy_(result)
