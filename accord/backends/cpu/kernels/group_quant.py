"""group_quant_linear on the cpu: each tile of weight rows is unpacked from its int32
words, dequantised in fp32 ((code - zero) * scale is exact there) and rounded once to
the GEMM's dtype, then multiplied by torch's GEMM (oneDNN; bf16 where the CPU has it).
The GEMM runs in x's dtype, or in fp32 for an fp32 output (the LM head's logits).

The codes are unpacked through a uint8 view of the words (op_contracts' unpack_codes).
No native kernel yet: every call dequantises the whole weight, so decode is bound by
that pass rather than by the packed bytes it streams.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from ....op_contracts import PER_CHANNEL, group_count, unpack_codes
from ._registry import KERNELS
from ._workspace import WORKSPACE

#: Weights dequantised per GEMM call (4 MiB of fp32): bounds the scratch memory.
TILE_ELEMENTS = 1 << 20


def dequantize_rows(
    qweight: torch.Tensor, scales: torch.Tensor, zeros: torch.Tensor | None, g_idx: torch.Tensor | None,
    bits: int, group_size: int, in_features: int,
) -> torch.Tensor:
    """Rows [n, K] of the weight in fp32 (exact: a code difference of at most 9 bits
    times a scale of at most 24)."""
    codes = unpack_codes(qweight, bits, in_features).float()
    zero = zeros.float() if zeros is not None else torch.full_like(scales, 1 << (bits - 1), dtype=torch.float32)
    scale = scales.float()
    if g_idx is not None:
        return (codes - zero[:, g_idx]) * scale[:, g_idx]
    # Channels in [rows, groups, group] blocks, the last one padded where partial.
    width = in_features if group_size == PER_CHANNEL else group_size
    groups = group_count(in_features, group_size)
    blocks = F.pad(codes, (0, groups * width - in_features)).view(-1, groups, width)
    return ((blocks - zero[:, :, None]) * scale[:, :, None]).view(-1, groups * width)[:, :in_features]


@KERNELS.register("group_quant_linear")
def group_quant_linear(
    x: torch.Tensor, qweight: torch.Tensor, scales: torch.Tensor, zeros: torch.Tensor | None, g_idx: torch.Tensor | None,
    bias: torch.Tensor | None, bits: int, group_size: int, out_dtype: torch.dtype | None, out: torch.Tensor,
) -> None:
    """out = x @ dequantise(qweight)^T (+ bias), a tile of weight rows at a time."""
    rows, depth = qweight.shape[0], x.shape[1]
    compute = torch.float32 if out.dtype == torch.float32 else x.dtype
    activations = x.to(compute)
    groups = None if g_idx is None else g_idx.long()
    tile_rows = max(1, TILE_ELEMENTS // depth)
    for first in range(0, rows, tile_rows):
        part = slice(first, min(first + tile_rows, rows))
        weight = dequantize_rows(
            qweight[part], scales[part], None if zeros is None else zeros[part], groups, bits, group_size, depth
        )
        tile = WORKSPACE.take("group quant tile", weight.shape, compute)
        tile.copy_(weight)
        part_bias = None if bias is None else bias[part].to(compute)
        out[:, part] = F.linear(activations, tile, part_bias)
