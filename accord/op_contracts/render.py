"""Renders the contracts as a Markdown reference (docs/contracts.md is this output)."""

from __future__ import annotations

from typing import Iterable, Mapping

import torch

from .spec import FP8_DTYPES, REQUIRED, OpContract, Switch, dtype_name


def _dtypes(dtypes: Iterable[torch.dtype]) -> str:
    return "/".join(dtype_name(d) for d in dtypes)


def _shape(shape: tuple[str, ...] | Switch) -> str:
    if isinstance(shape, Switch):
        return "; ".join(f"{shape.param}={value}: [{', '.join(dims)}]" for value, dims in shape.cases.items())
    return "[" + ", ".join(shape) + "]"


def _value(value: object) -> str:
    return dtype_name(value) if isinstance(value, torch.dtype) else repr(value)


def render_contract(contract: OpContract) -> str:
    """One op's section: semantics, arguments, outputs, groups, rules, tolerances."""
    lines = [f"## `{contract.name}`", "", contract.doc, "", "| argument | kind | dtypes | shape | notes |", "|---|---|---|---|---|"]
    for t in contract.tensors:
        notes = ", ".join(
            n for n in ("optional" if t.optional else "", "written in place" if t.mutated else "", t.doc) if n
        )
        lines.append(f"| `{t.name}` | tensor | {_dtypes(t.dtypes)} | {_shape(t.shape)} | {notes} |")
    for p in contract.params:
        default = "required" if p.default is REQUIRED else f"default {_value(p.default)}"
        choices = "one of " + ", ".join(_value(c) for c in p.choices) if p.choices else ""
        notes = ", ".join(n for n in (default, choices, p.doc) if n)
        lines.append(f"| `{p.name}` | {p.type.__name__} | | | {notes} |")
    lines += ["", "| output | dtype | shape |", "|---|---|---|"]
    for o in contract.outputs:
        # A dtype with alternatives (`param:out_dtype|like:x`) keeps its bar inside the cell.
        dtype = dtype_name(o.dtype) if isinstance(o.dtype, torch.dtype) else o.dtype.replace("|", "\\|")
        lines.append(f"| `{o.name}` | {dtype} | {_shape(o.shape)} |")
    if not contract.outputs:
        lines.append("| (none: writes its mutated arguments) | | |")
    if contract.dtype_groups:
        lines += ["", "Dtype groups (one dtype per group): " + "; ".join(", ".join(g) for g in contract.dtype_groups)]
    if contract.rules:
        lines += ["", "Rules: " + "; ".join(r.doc for r in contract.rules)]
    lines += ["", *_comparison_lines(contract), *_tolerance_lines(contract), ""]
    return "\n".join(lines)


def _comparison_lines(contract: OpContract) -> list[str]:
    """How conformance puts outputs in the form it compares, where the contract says."""
    lines = []
    if (rows := contract.unordered_rows) is not None:
        companions = f", `{'`, `'.join(rows.companions)}` following their ids" if rows.companions else ""
        lines.append(f"Compared with each row of `{rows.ids}` sorted by id (the order is free){companions}.")
    if (quantised := contract.dequantised) is not None:
        lines.append(f"`{quantised.values}` judged under NMSE by its dequantised value, `{quantised.values}` * "
                     f"`{quantised.scales}` (a scale per row, or per `{quantised.group_param}` columns).")
    return [*lines, ""] if lines else []


def _by_dtype(bounds: Mapping[torch.dtype, float]) -> str:
    return ", ".join(f"{dtype_name(d)} {v:g}" for d, v in bounds.items())


def _tolerance_lines(contract: OpContract) -> list[str]:
    """The conformance rule: ulps when the op is rounded once, else NMSE by the key's
    dtype (with the fp8-operand table where one is given)."""
    key = contract.tolerance_key or contract.primary
    if contract.ulps is not None:
        return [f"Tolerance (computed in fp32, rounded once): every floating output within this many ulps of its "
                f"dtype of the fp64 reference, an ulp no finer than fp32's at the row's largest value: "
                f"{_by_dtype(contract.ulps)}"]
    if contract.fp8_tolerance is not None:
        return [f"Tolerance (NMSE vs reference, by `{key}` dtype): {_by_dtype(contract.tolerance)}; with fp8 "
                f"operands (exact values, fp32 accumulation): {_by_dtype(contract.fp8_tolerance)}"]
    fp8_note = "; fp8 entry when any tensor is fp8" if any(d in FP8_DTYPES for d in contract.tolerance) else ""
    return [f"Tolerance (NMSE vs reference, by `{key}` dtype{fp8_note}): {_by_dtype(contract.tolerance)}"]


def render_reference(contracts: Iterable[OpContract]) -> str:
    """The whole reference page."""
    header = (
        "# Op contract reference\n\n"
        "Generated from `accord/op_contracts/contracts/` by `accord contracts`; do not edit by hand.\n"
        "Shapes are symbolic: a name is bound by the first tensor that shows it, and every\n"
        "other use must agree. Outputs are allocated by the dispatcher at the dtype shown.\n"
    )
    return header + "\n" + "\n".join(render_contract(c) for c in contracts)
