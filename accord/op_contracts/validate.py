"""Checks one bound call against its contract and computes the sizes its shapes name."""

from __future__ import annotations

from typing import Any, Mapping

import torch

from .errors import ContractError
from .shapes import DimExpr
from .spec import OpContract, ParamSpec, dtype_name, shape_dims


#: How one size is learned on the fast path: (symbol, tensor, axis, dimension).
SizeStep = tuple[str, str, int, DimExpr]


def describe_tensor(value: Any) -> str:
    """A tensor as an error message shows it: `int64[4, 2] on cpu`."""
    if value is None:
        return "absent"
    if not isinstance(value, torch.Tensor):
        return f"{type(value).__name__} {value!r}"
    return f"{dtype_name(value.dtype)}{list(value.shape)} on {value.device}"


def validate_call(contract: OpContract, call: Mapping[str, Any]) -> tuple[SizeStep, ...]:
    """Raise ContractError for the first way `call` breaks `contract`; return the order
    in which it learned its symbolic sizes, so later calls of the same signature can
    replay it without checking (`replay_sizes`)."""
    op = contract.name
    for spec in contract.params:
        _check_param(op, spec, call[spec.name])
    device = None
    for spec in contract.tensors:
        value = call[spec.name]
        if value is None:
            if not spec.optional:
                raise ContractError(op, spec.name, "a tensor", "absent")
            continue
        if not isinstance(value, torch.Tensor):
            raise ContractError(op, spec.name, "a torch.Tensor", describe_tensor(value))
        if value.dtype not in spec.dtypes:
            allowed = "/".join(dtype_name(d) for d in spec.dtypes)
            raise ContractError(op, spec.name, f"dtype {allowed}", dtype_name(value.dtype))
        dims = shape_dims(spec.shape, call)
        if value.dim() != len(dims):
            raise ContractError(op, spec.name, f"rank {len(dims)} {_shape_text(dims)}", describe_tensor(value))
        if spec.contiguous and not value.is_contiguous():
            raise ContractError(op, spec.name, "a contiguous tensor", "a strided view", hint="call .contiguous() first")
        if device is None:
            device = value.device
        elif value.device != device:
            raise ContractError(op, spec.name, f"a tensor on {device} like the others", str(value.device))
    for group in contract.dtype_groups:
        present = [(name, call[name]) for name in group if call[name] is not None]
        if len({t.dtype for _, t in present}) > 1:
            first_name, first = present[0]
            for name, tensor in present[1:]:
                if tensor.dtype != first.dtype:
                    raise ContractError(
                        op,
                        name,
                        f"{dtype_name(first.dtype)} like {first_name} (one dtype for {', '.join(group)})",
                        dtype_name(tensor.dtype),
                        hint="cast the group to one dtype at the call site",
                    )
    steps = _bind_sizes(contract, call)
    for rule in contract.rules:
        broken = rule.check(call)
        if broken is not None:
            raise ContractError(op, *broken)
    return steps


def replay_sizes(contract: OpContract, steps: tuple[SizeStep, ...], call: Mapping[str, Any]) -> dict[str, int]:
    """The sizes of a call whose signature already passed validation."""
    env: dict[str, int] = {p.name: call[p.name] for p in contract.params if p.type is int}
    for symbol, name, axis, dim in steps:
        size = call[name].shape[axis]
        env[symbol] = size if dim.text == symbol else dim.solve(size, env)[1]  # type: ignore[index]
    return env


def _bind_sizes(contract: OpContract, call: Mapping[str, Any]) -> tuple[SizeStep, ...]:
    """Learn every symbolic size from the call's tensors, check the rest agree, and
    return the order in which the sizes were learned."""
    env: dict[str, int] = {p.name: call[p.name] for p in contract.params if p.type is int}
    steps: list[SizeStep] = []
    pending: list[tuple[str, int, DimExpr, int]] = []
    for spec in contract.tensors:
        value = call[spec.name]
        if value is None:
            continue
        for axis, (dim, size) in enumerate(zip(shape_dims(spec.shape, call), value.shape)):
            pending.append((spec.name, axis, dim, size))
    # Bind what can be bound, repeatedly: "2*I" waits until nothing else can teach I.
    progress = True
    while pending and progress:
        progress = False
        for item in list(pending):
            name, axis, dim, size = item
            if dim.symbols <= env.keys():
                if dim.evaluate(env) != size:
                    raise ContractError(
                        contract.name,
                        name,
                        f"dim {axis} = {dim.text} = {dim.evaluate(env)} ({_env_text(dim, env)})",
                        str(size),
                    )
                pending.remove(item)
                progress = True
            else:
                solved = dim.solve(size, env)
                if solved is not None and solved[1] >= 0:
                    env[solved[0]] = solved[1]
                    steps.append((solved[0], name, axis, dim))
                    progress = True
    if pending:
        name, axis, dim, size = pending[0]
        raise ContractError(contract.name, name, f"dim {axis} = {dim.text}", f"{size} (size not determinable)")
    return tuple(steps)


def _check_param(op: str, spec: ParamSpec, value: Any) -> None:
    if value is None and spec.default is None:
        return
    ok = isinstance(value, spec.type)
    if spec.type is int and isinstance(value, bool):
        ok = False
    if spec.type is float and isinstance(value, int) and not isinstance(value, bool):
        ok = True
    if not ok:
        raise ContractError(op, spec.name, spec.type.__name__, f"{type(value).__name__} {value!r}")
    if spec.choices is not None and value not in spec.choices:
        choices = "/".join(dtype_name(c) if isinstance(c, torch.dtype) else str(c) for c in spec.choices)
        raise ContractError(op, spec.name, f"one of {choices}", repr(value))


def _shape_text(dims: tuple[DimExpr, ...]) -> str:
    return "[" + ", ".join(d.text for d in dims) + "]"


def _env_text(dim: DimExpr, env: Mapping[str, int]) -> str:
    return ", ".join(f"{s}={env[s]}" for s in sorted(dim.symbols))
