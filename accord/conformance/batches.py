"""Batch invariance: each row or sequence of a case run alone, compared bit for bit
with what it got among its batch mates. Rows of per-token ops (rows marked
independent), each sequence of an attention batch (its query rows, its block table
row and length), and each token of a cache write (its slot) are the units."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable, Mapping

import torch

from .case import Case, row_aligned_outputs, row_aligned_tensors
from .compare import same_bits

#: Compares the full run's outputs with the unit's own run: True when the bits agree.
Agreement = Callable[[Mapping[str, torch.Tensor], Mapping[str, torch.Tensor]], bool]


@dataclass(frozen=True)
class Unit:
    """One row, sequence or token of a case, as its own call, and how to compare it."""

    label: str
    args: dict[str, Any]
    agrees: Agreement


def units(case: Case, device: torch.device, several_row_counts: bool = False) -> list[Unit]:
    """The case's independent units, each as its own call (fresh arguments on
    `device`); empty when the case has fewer than two or no independent units. With
    `several_row_counts` (the batch-invariant run), row cases also run their first m
    rows as a batch of their own for m between 1 and all of them, so a kernel whose
    reduction order changes with the row count shows at every size it switches at."""
    if "query_start_loc" in case.args:
        found = _sequences(case, device)
    elif "slot_mapping" in case.args:
        found = _tokens(case, device)
    elif case.row_independent:
        found = _rows(case, device) + (_row_prefixes(case, device) if several_row_counts else [])
    else:
        found = []
    return found if len(found) > 1 else []


def _rows(case: Case, device: torch.device) -> list[Unit]:
    aligned = row_aligned_tensors(case.contract, case.args)
    outputs = row_aligned_outputs(case.contract, case.args)

    def unit(row: int) -> Unit:
        args = {k: v[row : row + 1] if k in aligned else v for k, v in case.fresh_args(device).items()}
        return Unit(f"row {row}", args, lambda full, alone: all(
            same_bits(alone[name], full[name][row : row + 1]) for name in outputs))

    return [unit(row) for row in range(case.row_count())]


def _row_prefixes(case: Case, device: torch.device) -> list[Unit]:
    """The first m rows as their own batch, for m = 2, about half, and all but one."""
    aligned = row_aligned_tensors(case.contract, case.args)
    outputs = row_aligned_outputs(case.contract, case.args)
    total = case.row_count()

    def unit(m: int) -> Unit:
        args = {k: v[:m] if k in aligned else v for k, v in case.fresh_args(device).items()}
        return Unit(f"rows 0-{m - 1}", args, lambda full, alone: all(
            same_bits(alone[name], full[name][:m]) for name in outputs))

    return [unit(m) for m in sorted({2, total // 2, total - 1}) if 1 < m < total]


def _sequences(case: Case, device: torch.device) -> list[Unit]:
    """Sequence b alone: its query rows, table row and length; the caches unchanged."""
    aligned = row_aligned_tensors(case.contract, case.args)
    outputs = row_aligned_outputs(case.contract, case.args)
    starts = case.args["query_start_loc"].tolist()

    def unit(b: int) -> Unit:
        first, last = starts[b], starts[b + 1]
        args = case.fresh_args(device)
        args.update({k: args[k][first:last] for k in aligned})
        args["block_tables"] = args["block_tables"][b : b + 1]
        args["seq_lens"] = args["seq_lens"][b : b + 1]
        args["query_start_loc"] = torch.tensor([0, last - first], dtype=args["query_start_loc"].dtype, device=device)
        return Unit(f"sequence {b}", args, lambda full, alone: all(
            same_bits(alone[name], full[name][first:last]) for name in outputs))

    return [unit(b) for b in range(len(starts) - 1)]


def _tokens(case: Case, device: torch.device) -> list[Unit]:
    """Token t alone writes its slot; that slot of every cache must hold the same bits."""
    aligned = row_aligned_tensors(case.contract, case.args)
    caches = [spec.name for spec in case.contract.tensors if spec.mutated and case.args.get(spec.name) is not None]

    def slot_of(cache: torch.Tensor, slot: int) -> torch.Tensor:
        return cache.reshape(cache.shape[0] * cache.shape[1], *cache.shape[2:])[slot]

    def unit(token: int, slot: int) -> Unit:
        args = {k: v[token : token + 1] if k in aligned else v for k, v in case.fresh_args(device).items()}
        return Unit(f"token {token}", args, lambda full, alone: all(
            same_bits(slot_of(alone[name], slot), slot_of(full[name], slot)) for name in caches))

    return [unit(t, slot) for t, slot in enumerate(case.args["slot_mapping"].tolist()) if slot >= 0]
