"""group_quant_linear on the cpu, chosen by rows (group_quant_gemm.c where it builds):
- up to `ROW_DOT_MAX_ROWS` tokens (decode) the row dot: each group's codes are dotted
  with the activations in fp32 straight from the packed words, and the group adds
  scale * (that - zero * the activations' sum), so the call streams the packed codes
  and never writes a dequantised weight (act-order rows: dequantised a row at a time);
- past that each tile of `TILE_ELEMENTS` weights is dequantised to fp32 ((code - zero)
  * scale is exact there), rounded once to the GEMM's dtype and handed to torch's GEMM
  (oneDNN; bf16 where the CPU has it), which wins once enough rows share each tile.
The GEMM runs in x's dtype, or in fp32 for an fp32 output (the LM head's logits).
Without a C compiler the tiles are dequantised with torch ops (op_contracts'
unpack_codes, through a uint8 view of the words) and every call takes the GEMM.
"""

from __future__ import annotations

from typing import Callable

import torch
import torch.nn.functional as F

from ....op_contracts import PER_CHANNEL, group_count, unpack_codes
from . import _native_group_quant
from ._registry import KERNELS
from ._workspace import WORKSPACE

#: Most tokens the row dot serves: it costs about one call's worth a token, the tiles
#: about a dequantisation and a bf16 GEMM whatever the rows (4096 x 4096 int4 g128, one
#: thread, load 10-12: 3.5-7.6 ms a token against 26-34 ms; act-order rows, dequantised
#: element by element, 46 ms at one token against the tiles' 62).
ROW_DOT_MAX_ROWS = 4
#: Weights dequantised per GEMM call (4 MiB of fp32): bounds the scratch memory.
TILE_ELEMENTS = 1 << 20
#: The built library the native paths call, or None (torch ops only): tests replace it
#: to force the torch path on a host that builds the library.
native_library: Callable[[], object | None] = _native_group_quant.library


def dequantize_rows(
    qweight: torch.Tensor, scales: torch.Tensor, zeros: torch.Tensor | None, g_idx: torch.Tensor | None,
    bits: int, group_size: int, in_features: int,
) -> torch.Tensor:
    """Rows [n, K] of the weight in fp32 with torch ops (exact: a code difference of at
    most 9 bits times a scale of at most 24)."""
    codes = unpack_codes(qweight, bits, in_features).float()
    zero = zeros.float() if zeros is not None else torch.full_like(scales, 1 << (bits - 1), dtype=torch.float32)
    scale = scales.float()
    if g_idx is not None:
        groups = g_idx.long()
        return (codes - zero[:, groups]) * scale[:, groups]
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
    """out = x @ dequantise(qweight)^T (+ bias): the row dot for few rows, dequantised
    tiles to the GEMM for more."""
    native = native_library() is not None
    scales32 = scales.float().contiguous()
    if native and x.shape[0] <= ROW_DOT_MAX_ROWS:
        direct = out.dtype == torch.float32
        result = out if direct else torch.empty(out.shape, dtype=torch.float32)
        bias32 = None if bias is None else bias.float().contiguous()
        _native_group_quant.linear(
            x.float().contiguous(), qweight, scales32, zeros, g_idx, bias32, result, bits, group_size
        )
        if not direct:
            out.copy_(result)
        return
    _tiled_gemm(x, qweight, scales32, zeros, g_idx, bias, bits, group_size, out, native)


def _tiled_gemm(
    x: torch.Tensor, qweight: torch.Tensor, scales: torch.Tensor, zeros: torch.Tensor | None,
    g_idx: torch.Tensor | None, bias: torch.Tensor | None, bits: int, group_size: int, out: torch.Tensor,
    native: bool,
) -> None:
    rows, depth = qweight.shape[0], x.shape[1]
    compute = torch.float32 if out.dtype == torch.float32 else x.dtype
    activations = x.to(compute)
    tile_rows = max(1, TILE_ELEMENTS // depth)
    for first in range(0, rows, tile_rows):
        part = slice(first, min(first + tile_rows, rows))
        tile = WORKSPACE.take("group quant tile", (part.stop - first, depth), torch.float32)
        if native:
            _native_group_quant.dequantize(qweight, scales, zeros, g_idx, first, tile, bits, group_size)
        else:
            tile.copy_(dequantize_rows(
                qweight[part], scales[part], None if zeros is None else zeros[part], g_idx, bits, group_size, depth
            ))
        weight = tile if compute == torch.float32 else tile.to(compute)
        part_bias = None if bias is None else bias[part].to(compute)
        out[:, part] = F.linear(activations, weight, part_bias)
