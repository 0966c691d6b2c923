"""The op contracts as torch.library custom ops, for torch.compile.

Each contract becomes `torch.ops.accord.<name>(dispatcher, <tensors>, <params>)`: an
op the compiler treats as opaque (its fake implementation gives the outputs' shapes and
dtypes from the contract's output specs, validating the call as the dispatcher would),
and whose real implementation calls the named dispatcher, so the kernels stay the
backend's and strict validation, hooks and ContractError behave as in eager mode. A
tensor the contract marks `mutated` (a KV cache) is declared written in the schema, so
the compiler keeps the write and its order.

`TorchOps(dispatcher)` offers the ops under their usual names (`ops.linear(x, w)`),
binding arguments as the dispatcher does, so a model can be handed it in place of the
dispatcher when its forward is compiled.
"""

from __future__ import annotations

import dataclasses
import itertools
import weakref
from typing import Any, Callable, Mapping

import torch

from .contracts import CONTRACTS
from .dispatcher import OpDispatcher
from .spec import OpContract, shape_dims
from .validate import replay_sizes, validate_call

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


class TorchOps:
    """A dispatcher's ops as the custom ops: `TorchOps(ops).linear(x, w)` calls
    `torch.ops.accord.linear`, which runs `ops.linear` (the dispatcher's kernel)."""

    def __init__(self, dispatcher: OpDispatcher) -> None:
        register_contract_ops(dispatcher.contracts)
        key = next(_KEYS)
        _DISPATCHERS[key] = dispatcher
        self.dispatcher = dispatcher
        self.backend = dispatcher.backend
        for contract in dispatcher.contracts.values():
            setattr(self, contract.name, _caller(dispatcher, contract, key))

    def prepare_linear_weight(self, weight: torch.Tensor) -> torch.Tensor:
        """The dispatcher's load-time form of a dense weight (see OpDispatcher)."""
        return self.dispatcher.prepare_linear_weight(weight)


def _caller(dispatcher: OpDispatcher, contract: OpContract, key: int) -> Callable[..., Any]:
    op = getattr(torch.ops, NAMESPACE).__getattr__(contract.name).default
    names = contract.arg_names

    def call(*args: Any, **kwargs: Any) -> Any:
        bound = dispatcher.bind(contract, args, kwargs)
        return op(key, *(bound[name] for name in names))

    call.__name__ = contract.name
    call.__doc__ = contract.doc
    return call
