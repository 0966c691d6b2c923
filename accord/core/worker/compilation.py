"""torch.compile of the model forward (`--compilation-config` / `-O`, vLLM's spelling).

The model's layers call their ops through the dispatcher; for compiling they are handed
a `TorchOps` instead, whose ops are the contracts' torch.library custom ops, so dynamo
traces the model's own tensor code (splits, views, residual adds) into one graph that
inductor fuses, while every contract call stays one opaque node running the backend's
kernel. Shapes are dynamic where they vary (dynamo's automatic dynamic shapes): the
first forward compiles for its shapes, a second with a new token count recompiles with
that dimension symbolic, and size 1 (a batch-1 decode) keeps a graph of its own.
Inductor's FX graph and AOT caches (TORCHINDUCTOR_CACHE_DIR) make a later start-up
with the same model skip code generation; dynamo still traces each start.
"""

from __future__ import annotations

from typing import Any, Callable

import torch

from ...op_contracts import OpDispatcher
from ...op_contracts.torch_ops import TorchOps
from ..models import CausalLM

Forward = Callable[..., torch.Tensor]


def compile_forward(model: CausalLM, ops: OpDispatcher) -> Forward:
    """The model's forward compiled with inductor, its layers calling `TorchOps(ops)`
    (so the model runs only through the returned function from then on)."""
    _replace_references(model, ops, TorchOps(ops))
    compiled = torch.compile(model.forward, backend="inductor")

    def forward(*args: Any) -> torch.Tensor:
        try:
            return compiled(*args)
        except torch._dynamo.exc.TorchRuntimeError:
            # The compiler wraps a ContractError raised while it traces (the fake
            # implementation validates); run the call eagerly so the dispatcher raises
            # the ContractError itself, as it would without compiling.
            model.forward(*args)
            raise

    return forward


def _replace_references(root: object, old: object, new: object) -> None:
    """Make every reference to `old` held by `root`'s layers (attributes of modules and
    accord objects, and items of the lists and dicts they hold) point to `new`. A tuple
    holding `old` cannot be rewritten: that raises rather than leave a layer calling the
    uncompiled dispatcher."""
    seen: set[int] = set()
    stack = [root]
    while stack:
        item = stack.pop()
        if id(item) in seen:
            continue
        seen.add(id(item))
        if isinstance(item, tuple):
            if any(value is old for value in item):
                raise TypeError(f"a tuple in the model holds {old!r}; hold it in a list or an attribute")
            stack.extend(item)
            continue
        if isinstance(item, list):
            slots = dict(enumerate(item))
        elif isinstance(item, dict):
            slots = dict(item)
        elif isinstance(item, torch.nn.Module) or type(item).__module__.startswith("accord.core"):
            slots = dict(getattr(item, "__dict__", {}))
        else:
            continue
        for key, value in slots.items():
            if value is not old:
                stack.append(value)
            elif isinstance(item, (list, dict)):
                item[key] = new  # type: ignore[index]
            else:
                setattr(item, key, new)
