"""One conformance case: an op, a named shape/variant, and the exact arguments to call
it with, generated from a seed so every backend and every run sees the same bits."""

from __future__ import annotations

import zlib
from dataclasses import dataclass
from typing import Any, Mapping

import torch

from ..op_contracts import CONTRACTS, OpContract, dtype_name
from ..op_contracts.spec import shape_dims

#: The table's combo label for calls the contract must refuse.
ILLEGAL_COMBO = "illegal calls"


@dataclass(frozen=True)
class Case:
    """A seeded call of `op`. `expect_refusal` marks an illegal call the contract must
    refuse with ContractError; `row_independent` says each row's result may depend
    only on that row, so conformance reports whether the first row run alone gives
    the bits it got in the batch (batch invariance). `prepared` names the weights
    handed through the backend's load-time form first (`prepare_linear_weight`, as a
    model does at load), so the kernel is checked on the form it runs on."""

    op: str
    name: str
    args: Mapping[str, Any]
    expect_refusal: bool = False
    row_independent: bool = False
    prepared: tuple[str, ...] = ()

    @property
    def contract(self) -> OpContract:
        """The contract of this case's op."""
        return CONTRACTS[self.op]

    @property
    def combo(self) -> str:
        """The dtype combination this case exercises, as the table's column shows it."""
        return ILLEGAL_COMBO if self.expect_refusal else dtype_combo(self.contract, self.args)

    def fresh_args(self, device: torch.device | None = None) -> dict[str, Any]:
        """The arguments with every tensor copied (to `device`, default where it was
        generated: the CPU), so no run can disturb another's."""
        return {
            k: v.to(device or v.device, copy=True) if isinstance(v, torch.Tensor) else v for k, v in self.args.items()
        }

    def row_count(self) -> int:
        """How many rows the primary tensor has (tokens, sequences or matrix rows)."""
        return int(self.args[self.contract.primary].shape[0])


def row_axis(contract: OpContract, call: Mapping[str, Any]) -> str:
    """The symbol of the primary tensor's first dimension (`T`, `B`, `M`)."""
    return shape_dims(contract.tensor(contract.primary).shape, call)[0].text


def row_aligned_tensors(contract: OpContract, call: Mapping[str, Any]) -> set[str]:
    """Tensor arguments whose first dimension is the row axis."""
    axis = row_axis(contract, call)
    return {
        spec.name
        for spec in contract.tensors
        if call.get(spec.name) is not None and shape_dims(spec.shape, call)[0].text == axis
    }


def row_aligned_outputs(contract: OpContract, call: Mapping[str, Any]) -> set[str]:
    """Outputs whose first dimension is the row axis."""
    axis = row_axis(contract, call)
    return {spec.name for spec in contract.outputs if shape_dims(spec.shape, call)[0].text == axis}


def dtype_combo(contract: OpContract, call: Mapping[str, Any]) -> str:
    """`x,weight=bf16 ids_dtype=int64`: the dtype of every tensor whose contract allows
    more than one (a dtype group whose members agree prints once), and dtype-valued
    parameters (output widths) the call sets. Fixed-dtype tensors add nothing and are
    left out."""
    grouped = {name: group for group in contract.dtype_groups for name in group}
    parts, shown = [], set()
    for spec in contract.tensors:
        value = call.get(spec.name)
        if value is None or spec.name in shown or len(spec.dtypes) == 1:
            continue
        group = [n for n in grouped.get(spec.name, (spec.name,)) if call.get(n) is not None]
        if len({call[n].dtype for n in group}) > 1:
            group = [spec.name]
        parts.append(f"{','.join(group)}={dtype_name(value.dtype)}")
        shown.update(group)
    parts += [
        f"{p.name}={dtype_name(call[p.name])}"
        for p in contract.params
        if p.type is torch.dtype and call.get(p.name) is not None
    ]
    return " ".join(parts)


def seeded(seed: int, *labels: object) -> torch.Generator:
    """A CPU generator seeded from `seed` and the labels, so a case's data does not
    change when other cases are added or filtered out."""
    text = "/".join(str(label) for label in (seed, *labels))
    return torch.Generator().manual_seed(zlib.crc32(text.encode()))


def randn(generator: torch.Generator, shape: tuple[int, ...], dtype: torch.dtype, scale: float = 1.0) -> torch.Tensor:
    """Normal values times `scale`, drawn in fp32 and rounded once to `dtype`."""
    return (torch.randn(shape, generator=generator) * scale).to(dtype)


def uniform(generator: torch.Generator, shape: tuple[int, ...], low: float, high: float) -> torch.Tensor:
    """fp32 values uniform in [low, high) (positive scales, probabilities)."""
    return torch.rand(shape, generator=generator) * (high - low) + low


def randint(generator: torch.Generator, high: int, shape: tuple[int, ...], dtype: torch.dtype) -> torch.Tensor:
    """Integers in [0, high) at index dtype `dtype`."""
    return torch.randint(high, shape, generator=generator).to(dtype)


def distinct_rows(generator: torch.Generator, rows: int, high: int, width: int) -> torch.Tensor:
    """`rows` rows of `width` distinct integers in [0, high), as int64."""
    return torch.stack([torch.randperm(high, generator=generator)[:width] for _ in range(rows)])
