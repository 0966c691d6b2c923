"""Batch-invariant variants of the cpu kernels whose rounding depends on the batch
(`CpuBackend.batch_variant_ops`), for `--batch-invariant`: one mechanism, row tiles of
a fixed size.

torch's and oneDNN's GEMMs choose their blocking (and so each sum's order) by the
number of rows, and the linear kernel takes its bf16-weight path only for a few rows;
fused_moe groups tokens by expert, so an expert's GEMM sees as many rows as tokens
chose it. Each variant here cuts the rows into tiles of exactly `rows` rows (the last
one padded with zeros), and runs the default kernel on each tile: every row then goes
through the same call shape, whatever the batch, so its bits do not depend on its
batch mates. GEMMs take 16-row tiles (their per-row reduction order is fixed at one
M); fused_moe and lora_linear take one token at a time (their GEMMs always see one row).
Conformance's batch-invariant run checks each at several row counts, bit for bit."""

from __future__ import annotations

import functools
from dataclasses import dataclass
from typing import Any, Callable, Mapping

import torch

from . import fp8, group_quant, linear, lora, moe, quant
from ._registry import KERNELS

#: Rows per tile of the GEMM-shaped kernels: past the bf16-weight path's few rows, so
#: every tile takes oneDNN's prepacked path, and small enough that a decode step pads
#: little (a batch of 1 computes 16 rows).
GEMM_TILE_ROWS = 16


@dataclass(frozen=True)
class RowTiling:
    """How to cut a call into row tiles: the arguments and outputs whose first
    dimension is the row axis (`row_args` may depend on the call, e.g. scales that are
    per row only in some modes), and the tile's row count."""

    rows: int
    row_outputs: tuple[str, ...]
    row_args: Callable[[Mapping[str, Any]], tuple[str, ...]]


def _tile(values: Mapping[str, Any], names: tuple[str, ...], start: int, stop: int, rows: int) -> dict[str, Any]:
    """`values` with each named tensor's rows start..stop, zero-padded to `rows` rows."""
    tiled = dict(values)
    for name in names:
        tensor = values[name]
        if tensor is None:
            continue
        piece = tensor[start:stop]
        if piece.shape[0] < rows:
            pad = torch.zeros((rows - piece.shape[0], *tensor.shape[1:]), dtype=tensor.dtype, device=tensor.device)
            piece = torch.cat([piece, pad])
        tiled[name] = piece
    return tiled


def row_tiled(kernel: Callable[..., None], tiling: RowTiling) -> Callable[..., None]:
    """`kernel` run on fixed-size row tiles of every call (see the module's docstring)."""

    @functools.wraps(kernel)  # the contract's parameter names, checked at registration
    def invariant(**call: Any) -> None:
        row_args, rows = tiling.row_args(call), tiling.rows
        total = call[tiling.row_outputs[0]].shape[0]
        for start in range(0, total, rows):
            stop = min(start + rows, total)
            tile = _tile(call, row_args, start, stop, rows)
            outputs = {name: torch.empty((rows, *call[name].shape[1:]), dtype=call[name].dtype,
                                         device=call[name].device) for name in tiling.row_outputs}
            kernel(**{**tile, **outputs})
            for name in tiling.row_outputs:
                call[name][start:stop] = outputs[name][: stop - start]

    invariant.__doc__ = f"{kernel.__name__} on {tiling.rows}-row tiles (batch invariant)."
    return invariant


def _scaled_mm_rows(call: Mapping[str, Any]) -> tuple[str, ...]:
    """a's rows, and a_scale's where it has one row per row of a (row and block modes)."""
    return ("a",) if call["scale_mode"] == "tensor" else ("a", "a_scale")


TILINGS: dict[str, tuple[Callable[..., None], RowTiling]] = {
    "linear": (linear.linear, RowTiling(GEMM_TILE_ROWS, ("out",), lambda call: ("x",))),
    "scaled_mm": (fp8.scaled_mm, RowTiling(GEMM_TILE_ROWS, ("out",), _scaled_mm_rows)),
    "moe_route": (moe.moe_route, RowTiling(GEMM_TILE_ROWS, ("topk_weights", "topk_ids"),
                                           lambda call: ("router_logits", "token_ids"))),
    "fused_moe": (moe.fused_moe, RowTiling(1, ("out",), lambda call: ("hidden", "topk_weights", "topk_ids"))),
    # One token at a time: its adapter's two GEMMs then always see one row.
    "lora_linear": (lora.lora_linear, RowTiling(1, ("out",), lambda call: ("y", "x", "slot_ids"))),
    # Tiles of 8 padded rows: each takes one path (the row dot or the token tile, by
    # format) whatever the batch, and both compute each token on its own.
    "quant_linear": (quant.quant_linear, RowTiling(8, ("out",), lambda call: ("x",))),
    # Tiles of the row dot's most rows: every token takes the row dot, which computes
    # each token on its own (without the C library, the same 4-row GEMM every call).
    "group_quant_linear": (group_quant.group_quant_linear,
                           RowTiling(group_quant.ROW_DOT_MAX_ROWS, ("out",), lambda call: ("x",))),
}

for _op, (_kernel, _tiling) in TILINGS.items():
    KERNELS.register(_op, invariant_variant=True)(row_tiled(_kernel, _tiling))
