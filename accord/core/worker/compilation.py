"""torch.compile of the model forward (`--compilation-config` / `-O`, vLLM's spelling).

The model is built on a dispatcher made with `compiled=True` and runs on it, compiled
or not: while dynamo traces the forward, each of the dispatcher's op calls becomes the
contract's torch.library custom op (op_contracts/torch_ops.py), so dynamo traces the
model's own tensor code (splits, views, residual adds) into one graph that inductor
fuses, while every contract call stays one opaque node running the backend's kernel.
Shapes are dynamic where they vary (dynamo's automatic dynamic shapes): the first
forward compiles for its shapes, a second with a new token count recompiles with that
dimension symbolic, and size 1 (a batch-1 decode) keeps a graph of its own. Inductor's
FX graph and AOT caches (TORCHINDUCTOR_CACHE_DIR) make a later start-up with the same
model skip code generation; dynamo still traces each start.
"""

from __future__ import annotations

from typing import Any, Callable

import torch

from ...op_contracts import OpDispatcher
from ..models import CausalLM

Forward = Callable[..., torch.Tensor]


def compile_forward(model: CausalLM, ops: OpDispatcher) -> Forward:
    """The model's forward compiled with inductor; `ops`, the dispatcher the model was
    built on, must have been made with `compiled=True` (else its op calls would be
    traced into, kernels and all)."""
    if not ops.compiled:
        raise ValueError("compile_forward needs the model built on OpDispatcher(backend, compiled=True)")
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
