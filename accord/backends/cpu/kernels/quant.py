"""quant_linear on the packed GGUF blocks, chosen by rows: up to `DOT_MAX_ROWS` tokens
(decode) the weights stream packed through int8 dot products on activations quantised
per 32 (gguf_quant_gemm.c: VNNI, AVX2 or plain C, the best this host's build has, or
the one `ACCORD_CPU_QUANT_PATH` names); from there on each tile of `TILE_ELEMENTS`
weights is dequantised and handed to torch's GEMM in x's dtype (oneDNN, AMX for bf16
where present), whose compute wins once enough rows share each dequantised weight. Without a C
compiler every call takes gguf-py's dequantisation (numpy) and the GEMM.
"""

from __future__ import annotations

import os

import gguf
import torch
import torch.nn.functional as F

from . import _native_quant
from ._registry import KERNELS
from ._workspace import WORKSPACE

#: Most tokens the packed dot path serves; more take the dequantised-tile GEMM.
DOT_MAX_ROWS = 8
#: fp32 elements dequantised per GEMM call (4 MiB tiles: 256 rows of K = 4096, 1820 of
#: K = 576); fewer, larger tiles cost less Python per call than 256-row ones did.
TILE_ELEMENTS = 1 << 20
#: Names one dot path (plain, avx2, vnni) instead of the best built one: tests force each.
PATH_ENV = "ACCORD_CPU_QUANT_PATH"


def dot_path() -> str | None:
    """The dot path calls take: `PATH_ENV`'s, else the best this host's build has; None
    without a library. Raises ValueError for a path the build lacks."""
    built = _native_quant.compiled_paths()
    wanted = os.environ.get(PATH_ENV)
    if wanted is None:
        return built[-1] if built else None
    if wanted not in built:
        raise ValueError(f"{PATH_ENV}={wanted!r}: this host's build has only {list(built)}")
    return wanted


@KERNELS.register("quant_linear")
def quant_linear(
    x: torch.Tensor, qweight: torch.Tensor, bias: torch.Tensor | None, quant_type: str,
    out_dtype: torch.dtype | None, out: torch.Tensor,
) -> None:
    """out = x @ dequantise(qweight)^T (+ bias): packed dots for few rows, tiles to the
    GEMM for many."""
    path = dot_path()
    if path is not None and x.shape[0] <= DOT_MAX_ROWS:
        _packed_dot(x, qweight, bias, quant_type, path, out)
        return
    _tiled_gemm(x, qweight, bias, quant_type, out, path is not None)


def _packed_dot(
    x: torch.Tensor, qweight: torch.Tensor, bias: torch.Tensor | None, quant_type: str, path: str, out: torch.Tensor,
) -> None:
    x32 = x.float().contiguous()
    bias32 = None if bias is None else bias.float().contiguous()
    tokens, depth = x.shape
    # Fresh (small) buffers, not the shared workspace: a captured decode graph keeps
    # the pointers it recorded, and holds what was allocated during its capture.
    scratch = torch.empty(_native_quant.scratch_bytes(tokens, depth), dtype=torch.uint8)
    direct = out.dtype == torch.float32 and out.is_contiguous()
    result = out if direct else torch.empty(out.shape, dtype=torch.float32)
    _native_quant.dot(x32, qweight, bias32, quant_type, path, result, scratch)
    if not direct:
        out.copy_(result)


def _tiled_gemm(
    x: torch.Tensor, qweight: torch.Tensor, bias: torch.Tensor | None, quant_type: str, out: torch.Tensor,
    native: bool,
) -> None:
    rows, depth = qweight.shape[0], x.shape[1]
    tile_rows = max(1, TILE_ELEMENTS // depth)
    # The GEMM runs in x's dtype (fp32 products of an fp32 out's half operands are exact).
    for first in range(0, rows, tile_rows):
        count = min(tile_rows, rows - first)
        tile = WORKSPACE.take("gguf tile", (count, depth), torch.float32)
        if native:
            _native_quant.dequantize(qweight, first, tile, quant_type)
        else:
            stored = qweight[first : first + count].numpy()
            tile.copy_(torch.from_numpy(gguf.quants.dequantize(stored, gguf.GGMLQuantizationType[quant_type])))
        weight = tile if x.dtype == torch.float32 else tile.to(x.dtype)
        part_bias = None if bias is None else bias[first : first + count].to(x.dtype)
        product = F.linear(x, weight, part_bias)
        out[:, first : first + count] = product
