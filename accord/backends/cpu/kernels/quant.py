"""The GGUF block kernels: quant_embedding looks rows up in gguf_quant_gemm.c (or
gguf-py, without a C compiler); quant_linear on the packed blocks is chosen by rows (gguf_quant_gemm.c; VNNI, AVX2
or plain C, the best this host's build has, or the one `ACCORD_CPU_QUANT_PATH` names),
activations quantised to int8 per 32 as ggml's dot products take them:
- up to `row_dot_max_rows` tokens (decode) each output row's blocks stream once and are
  dotted with every token's codes (the row dot): bound by the weight stream;
- from there the token-tile GEMM unpacks each panel of 16 weight rows once per call and
  runs every token over it, a few tokens at a time in registers: for fp32 activations at
  any row count, for bf16/fp16 ones up to `TILE_MAX_ROWS`;
- past that, half-precision calls dequantise each tile of `TILE_ELEMENTS` weights and
  hand it to torch's GEMM in x's dtype (oneDNN, AMX for bf16 where present), whose
  compute wins once enough rows share each dequantised weight. An fp32 GEMM never
  does: int8 products are four times as dense in a vector as fp32 ones, and the token
  tile measured 2.0-2.3x faster than the fp32 GEMM of the same weights dequantised,
  from 16 to 2048 rows (SmolLM2-135M's four projections of a layer, Q4_1, one thread,
  2-core Zen 4 KVM guest).
The half-precision crossovers are the ones measured on the 152M bench Llama's
projections (2-core Sapphire Rapids, one thread, CPU time; `benchmarks/quant_gguf_cpu.py`
runs whole models). Without a C compiler every call takes gguf-py's dequantisation
(numpy) and the GEMM.

AMX-INT8 was tried for the token tile and left out: the panel is already an AMX B tile
and tdpbsud ran (this KVM host grants the tiles), but one tile per 32-weight group (each
group has its own scale) leaves 16 fp32 rescales per tile, and the AMX tile measured
0.12 ms per token on the 152M gate_up projection against the VNNI tile's 0.076 (one
thread, loaded host).
"""

from __future__ import annotations

import os

import gguf
import torch
import torch.nn.functional as F

from . import _native_quant
from ._registry import KERNELS
from ._workspace import WORKSPACE

#: Most tokens the row dot serves, by format: the 32-wide formats whose codes load
#: straight into a vector (Q8_0, Q4_0, Q4_1) tie the token tile near 12 tokens, the
#: formats unpacked through memory from 3-4 (one thread, the 152M projections).
ROW_DOT_MAX_ROWS = {"Q8_0": 8, "Q4_0": 8, "Q4_1": 8}
DEFAULT_ROW_DOT_MAX_ROWS = 3
#: Most tokens the token-tile GEMM serves for bf16/fp16 activations: it beat the
#: dequantised tiles' bf16 GEMM 3x at 32 rows, 1.3x at 128 and tied them at 256 (Q4_K,
#: Q6_K). fp32 activations take it at any row count.
TILE_MAX_ROWS = 256
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


def row_dot_max_rows(quant_type: str) -> int:
    """Most tokens the row dot serves for `quant_type`; more take the token tile."""
    return ROW_DOT_MAX_ROWS.get(quant_type, DEFAULT_ROW_DOT_MAX_ROWS)


@KERNELS.register("quant_linear")
def quant_linear(
    x: torch.Tensor, qweight: torch.Tensor, bias: torch.Tensor | None, quant_type: str,
    out_dtype: torch.dtype | None, out: torch.Tensor,
) -> None:
    """out = x @ dequantise(qweight)^T (+ bias): the row dot for few rows, the token-tile
    GEMM for more, dequantised tiles to a half-precision GEMM for many."""
    path = dot_path()
    rows = x.shape[0]
    if path is not None and (rows <= TILE_MAX_ROWS or x.dtype == torch.float32):
        _packed(x, qweight, bias, quant_type, path, out, "token tile" if rows > row_dot_max_rows(quant_type) else "row dot")
        return
    _tiled_gemm(x, qweight, bias, quant_type, out, path is not None)


def _packed(
    x: torch.Tensor, qweight: torch.Tensor, bias: torch.Tensor | None, quant_type: str, path: str, out: torch.Tensor,
    kernel: str,
) -> None:
    x32 = x.float().contiguous()
    bias32 = None if bias is None else bias.float().contiguous()
    tokens, depth = x.shape
    # Fresh (small) buffers, not the shared workspace: a captured decode graph keeps
    # the pointers it recorded, and holds what was allocated during its capture.
    scratch = torch.empty(_native_quant.scratch_bytes(tokens, depth), dtype=torch.uint8)
    direct = out.dtype == torch.float32 and out.is_contiguous()
    result = out if direct else torch.empty(out.shape, dtype=torch.float32)
    _native_quant.dot(x32, qweight, bias32, quant_type, path, result, scratch, kernel)
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


@KERNELS.register("quant_embedding")
def quant_embedding(
    ids: torch.Tensor, qweight: torch.Tensor, quant_type: str, hidden_size: int, out_dtype: torch.dtype,
    out: torch.Tensor,
) -> None:
    """out = dequantise(qweight[ids]): the native lookup writes fp32 or bf16 rows (an fp16
    output is rounded from fp32 rows once), gguf-py dequantises them without a library."""
    if _native_quant.compiled_paths():
        direct = out.dtype in (torch.float32, torch.bfloat16)
        rows = out if direct else torch.empty(out.shape, dtype=torch.float32)
        _native_quant.embedding(ids.long().contiguous(), qweight, rows, quant_type)
        if not direct:
            out.copy_(rows)
        return
    stored = qweight[ids.long()].numpy()
    out.copy_(torch.from_numpy(gguf.quants.dequantize(stored, gguf.GGMLQuantizationType[quant_type])))
