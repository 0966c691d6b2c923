"""Illegal calls derived from a legal case by reading its contract: a wrong rank, a
dtype outside the contract, an index tensor at a width no contract allows, a dtype
group split across two dtypes, a dimension that disagrees with its symbol, and a
parameter outside its choices. Every one must be refused with ContractError."""

from __future__ import annotations

import dataclasses
from typing import Any, Iterator

import torch

from ...op_contracts import OpContract, dtype_name
from ...op_contracts.spec import shape_dims
from ..case import Case


def _illegal(case: Case, what: str, **changes: Any) -> Case:
    return dataclasses.replace(
        case, name=what, args={**case.fresh_args(), **changes}, expect_refusal=True, row_independent=False
    )


def _present(contract: OpContract, args: dict[str, Any]) -> list[str]:
    return [spec.name for spec in contract.tensors if args.get(spec.name) is not None]


def _mixed_groups(case: Case, contract: OpContract) -> Iterator[Case]:
    for group in contract.dtype_groups:
        present = [name for name in group if case.args.get(name) is not None]
        if len(present) < 2:
            continue
        first, second = case.args[present[0]], present[1]
        other = next((d for d in contract.tensor(second).dtypes if d != first.dtype), None)
        if other is not None:
            what = f"mixed dtype group: {second} {dtype_name(other)} vs {present[0]}"
            yield _illegal(case, what, **{second: case.args[second].to(other)})


def _disagreeing_dim(case: Case, contract: OpContract) -> Iterator[Case]:
    """Grow by one the first dimension that repeats a symbol an earlier tensor set."""
    seen: set[str] = set()
    for name in _present(contract, dict(case.args)):
        for axis, dim in enumerate(shape_dims(contract.tensor(name).shape, case.args)):
            if dim.text in seen and dim.text.isidentifier():
                tensor = case.args[name]
                grown = torch.cat([tensor, tensor.narrow(axis, 0, 1)], dim=axis)
                yield _illegal(case, f"bad shape: {name} dim {axis} != {dim.text}", **{name: grown})
                return
            seen.add(dim.text)


def _bad_choice(case: Case, contract: OpContract) -> Iterator[Case]:
    for spec in contract.params:
        if spec.choices is None or spec.type is bool:
            continue
        bad: Any = torch.float64 if spec.type is torch.dtype else "not-a-choice"
        yield _illegal(case, f"bad parameter: {spec.name}={bad}", **{spec.name: bad})
        return


def illegal_cases(case: Case) -> list[Case]:
    """The illegal variants of legal `case`, each breaking one rule of its contract."""
    contract = case.contract
    primary = case.args[contract.primary]
    cases = [
        _illegal(case, f"wrong rank: {contract.primary} {primary.dim() + 1}-D", **{contract.primary: primary[None]}),
        _illegal(case, f"dtype outside contract: {contract.primary} fp64", **{contract.primary: primary.double()}),
    ]
    index = [n for n in _present(contract, dict(case.args)) if contract.tensor(n).index]
    if index:
        narrow = case.args[index[0]].to(torch.int16)
        cases.append(_illegal(case, f"index width: {index[0]} int16", **{index[0]: narrow}))
    cases += [*_mixed_groups(case, contract), *_disagreeing_dim(case, contract), *_bad_choice(case, contract)]
    return cases
