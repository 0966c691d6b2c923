"""The op contracts as torch.library custom ops: how a compiled forward calls an op.

Each contract becomes `torch.ops.accord.<name>(dispatcher, <tensors>, <params>)`: an
op the compiler treats as opaque (its fake implementation gives the outputs' shapes and
dtypes from the contract's output specs, validating the call as the dispatcher would),
and whose real implementation calls the op's handle on the dispatcher the call names,
so the kernels stay the backend's and strict validation, hooks and ContractError behave
as in eager mode. A tensor the contract marks `mutated` (a KV cache) is declared written
in the schema, so the compiler keeps the write and its order.

Nothing here is a second way to a kernel: a dispatcher made with `compiled=True`
registers itself here, and while torch.compile traces, its handles call `traced_call`
instead of running (dispatcher.py). A custom op's arguments are tensors and scalars,
so the dispatcher travels as the integer key it registered under.
"""

from __future__ import annotations

import dataclasses
import itertools
import weakref
from typing import TYPE_CHECKING, Any, Callable, Mapping

import torch

from .contracts import CONTRACTS
from .spec import OpContract, shape_dims
from .validate import replay_sizes, validate_call

if TYPE_CHECKING:
    from .dispatcher import OpDispatcher

#: The torch.library namespace: `torch.ops.accord.<op>`.
NAMESPACE = "accord"

_SCHEMA_TYPES: Mapping[type, str] = {bool: "bool", int: "int", float: "float", str: "str", torch.dtype: "ScalarType"}

#: Dispatchers a custom op may be asked to run on, by the number its calls carry (a
#: custom op's arguments are tensors and scalars, so the dispatcher travels as a key).
_DISPATCHERS: "weakref.WeakValueDictionary[int, OpDispatcher]" = weakref.WeakValueDictionary()
_KEYS = itertools.count()
_LIBRARY: torch.library.Library | None = None


def schema_of(contract: OpContract) -> str:
    """The torch.library schema of a contract: `(int dispatcher, Tensor x, ..., float eps) -> Tensor`."""
    args = ["int dispatcher"]
    aliases = iter("abcdefghijklmnopqrstuvwxyz")
    for spec in contract.tensors:
        kind = f"Tensor({next(aliases)}!)" if spec.mutated else "Tensor"
        args.append(f"{kind}{'?' if spec.optional else ''} {spec.name}")
    # A parameter that may be None (an output dtype that follows a tensor's) is optional.
    args += [f"{_SCHEMA_TYPES[spec.type]}{'?' if spec.default is None else ''} {spec.name}" for spec in contract.params]
    outputs = ", ".join("Tensor" for _ in contract.outputs)
    returns = "Tensor" if len(contract.outputs) == 1 else f"({outputs})"
    return f"({', '.join(args)}) -> {returns}"


def register_contract_ops(contracts: Mapping[str, OpContract] = CONTRACTS) -> None:
    """Define `torch.ops.accord.<name>` for every contract (once per process)."""
    global _LIBRARY
    if _LIBRARY is not None:
        return
    library = torch.library.Library(NAMESPACE, "FRAGMENT")
    for contract in contracts.values():
        library.define(contract.name + schema_of(contract))
        library.impl(contract.name, _run_on_dispatcher(contract), "CompositeExplicitAutograd")
        torch.library.register_fake(f"{NAMESPACE}::{contract.name}", _fake(contract), lib=library)
    _LIBRARY = library


def _run_on_dispatcher(contract: OpContract) -> Callable[..., Any]:
    name = contract.name

    def run(dispatcher: int, *values: Any) -> Any:
        return getattr(_DISPATCHERS[dispatcher], name)(*values)

    return run


def _fake(contract: OpContract) -> Callable[..., Any]:
    """Outputs of the contract's shapes and dtypes, after validating the call's dtypes,
    ranks, sizes and rules (so a call the contract refuses fails while the compiler
    traces). Layout is left to the dispatcher when the op runs: the compiler's stand-in
    for an opaque tensor (a prepacked oneDNN weight) has no meaningful strides."""
    traced = dataclasses.replace(
        contract, tensors=tuple(dataclasses.replace(spec, contiguous=False) for spec in contract.tensors)
    )

    def fake(dispatcher: int, *values: Any) -> Any:
        call = dict(zip(contract.arg_names, values))
        sizes = replay_sizes(contract, validate_call(traced, call), call)
        device = call[contract.primary].device
        outputs = tuple(
            torch.empty(
                tuple(d.evaluate(sizes) for d in shape_dims(spec.shape, call)),
                dtype=spec.dtype_of(call),
                device=device,
            )
            for spec in contract.outputs
        )
        if not outputs:
            return None
        return outputs[0] if len(outputs) == 1 else outputs

    return fake


def register_dispatcher(dispatcher: "OpDispatcher", contracts: Mapping[str, OpContract] = CONTRACTS) -> int:
    """Define the custom ops (once per process) and give `dispatcher` the key its
    traced calls name it by (held weakly: a dropped dispatcher leaves no entry)."""
    register_contract_ops(contracts)
    key = next(_KEYS)
    _DISPATCHERS[key] = dispatcher
    return key


def traced_call(dispatcher: "OpDispatcher", contract: OpContract, args: tuple[Any, ...], kwargs: Mapping[str, Any]) -> Any:
    """The call of `contract`'s op on `dispatcher` as torch.compile traces it: the
    arguments bound to the contract's names as the dispatcher binds them (refused with
    ContractError alike), then its custom op, one opaque node of the graph."""
    bound = dispatcher.bind(contract, args, kwargs)
    op = getattr(getattr(torch.ops, NAMESPACE), contract.name).default
    return op(dispatcher.key, *(bound[name] for name in contract.arg_names))
