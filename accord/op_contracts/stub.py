"""Renders the contracts as a typed Python class, `Ops` (accord/op_contracts/typed_ops.py
is this output), so that type checkers and editors know every `ops.<name>(...)`: its
parameters, their types and defaults, what it returns, and the contract's doc."""

from __future__ import annotations

from typing import Iterable

import torch

from .render import _dtypes, _shape
from .spec import REQUIRED, OpContract, ParamSpec, TensorSpec, dtype_name

#: Where the rendered stub lives, relative to the repository root.
STUB_PATH = "accord/op_contracts/typed_ops.py"

_HEADER = '''"""The ops every OpDispatcher serves, typed. Generated from accord/op_contracts/contracts/
by `accord contracts --stub`; do not edit by hand (tests/op_contracts keeps it current).

Type checkers and editors see `OpDispatcher` as a subclass of `Ops` (dispatcher.py
says so under TYPE_CHECKING), so `ops.rms_norm(...)` resolves to the method here, with
the contract's signature and doc. At run time the dispatcher serves each op through an
`OpHandle` and this class is never used.
"""

from __future__ import annotations

from typing import Literal

import torch


class Ops:
    """Every op contract as a method: tensors, then parameters, in contract order;
    outputs are allocated by the dispatcher and returned."""
'''


def _annotation(param: ParamSpec) -> str:
    """A parameter's type: a Literal of its choices for str and int code paths."""
    if param.choices is not None and param.type in (str, int):
        return f"Literal[{', '.join(repr(c) for c in param.choices)}]"
    name = "torch.dtype" if param.type is torch.dtype else param.type.__name__
    return f"{name} | None" if param.default is None else name


def _tensor_annotation(spec: TensorSpec) -> str:
    return "torch.Tensor | None" if spec.optional else "torch.Tensor"


def _parameters(contract: OpContract) -> list[str]:
    """The method's parameters. Python's signatures cannot say "optional by keyword,
    but positional when a required argument follows", so: an optional tensor gets its
    None default only when no required tensor follows it, and a required parameter
    after a defaulted argument starts the keyword-only part (`*`)."""
    parts = ["self"]
    required_tensor_follows = [
        any(not later.optional for later in contract.tensors[index + 1 :]) for index in range(len(contract.tensors))
    ]
    defaulted = False
    for spec, pinned in zip(contract.tensors, required_tensor_follows):
        if spec.optional and not pinned:
            parts.append(f"{spec.name}: {_tensor_annotation(spec)} = None")
            defaulted = True
        else:
            parts.append(f"{spec.name}: {_tensor_annotation(spec)}")
    keyword_only = False
    for param in contract.params:
        if param.default is REQUIRED:
            if defaulted and not keyword_only:
                parts.append("*")
                keyword_only = True
            parts.append(f"{param.name}: {_annotation(param)}")
        else:
            parts.append(f"{param.name}: {_annotation(param)} = {param.default!r}")
            defaulted = True
    return parts


def _returns(contract: OpContract) -> str:
    if not contract.outputs:
        return "None"
    if len(contract.outputs) == 1:
        return "torch.Tensor"
    return f"tuple[{', '.join('torch.Tensor' for _ in contract.outputs)}]"


def _docstring(contract: OpContract) -> list[str]:
    """The contract's doc, then one line per argument and output (dtypes, shape, note)."""
    lines = [contract.doc, ""]
    for spec in contract.tensors:
        note = f": {spec.doc}" if spec.doc else ""
        written = " (written in place)" if spec.mutated else ""
        lines.append(f"{spec.name}: {_dtypes(spec.dtypes)} {_shape(spec.shape)}{written}{note}")
    lines += [f"{param.name}: {param.doc}" for param in contract.params if param.doc]
    for output in contract.outputs:
        dtype = dtype_name(output.dtype) if isinstance(output.dtype, torch.dtype) else output.dtype
        lines.append(f"returns {output.name}: {dtype} {_shape(output.shape)}" + (f": {output.doc}" if output.doc else ""))
    if not contract.outputs:
        lines.append("returns None: writes its in-place arguments")
    return lines


def _wrap(text: str, indent: str, width: int = 100) -> list[str]:
    """`text` as lines of at most `width` characters (a word longer than that stays whole)."""
    lines, line = [], ""
    for word in text.split():
        if line and len(indent) + len(line) + 1 + len(word) > width:
            lines.append(indent + line)
            line = word
        else:
            line = f"{line} {word}" if line else word
    return [*lines, indent + line] if line else [indent.rstrip()]


def render_method(contract: OpContract) -> str:
    """One op as a typed method with the contract's doc."""
    indent = " " * 8
    lines = [f"    def {contract.name}("]
    lines += [f"{indent}{part}," for part in _parameters(contract)]
    lines.append(f"    ) -> {_returns(contract)}:")
    doc = _docstring(contract)
    body = [wrapped for paragraph in doc for wrapped in _wrap(paragraph.replace('"""', "'''"), indent)]
    lines.append(f'{indent}"""{body[0].lstrip()}')
    lines += body[1:]
    lines.append(f'{indent}"""')
    lines.append(f"{indent}raise NotImplementedError  # served by OpDispatcher.__getattr__")
    return "\n".join(lines)


def render_ops_stub(contracts: Iterable[OpContract]) -> str:
    """The whole typed_ops.py module."""
    return _HEADER + "".join(f"\n{render_method(c)}\n" for c in contracts)
