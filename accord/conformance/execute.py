"""Runs one case through a dispatcher with poisoned, guarded buffers and collects what
the kernel wrote, and what it should not have."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import torch

from ..op_contracts import OpDispatcher
from .allocator import PoisonAllocator, count_poisoned
from .case import Case
from .compare import same_bits


@dataclass(frozen=True)
class Execution:
    """The tensors a run produced (outputs and mutated operands, by name, copied to the
    CPU for comparison) and the evidence of stray writes: guard breaches, unwritten
    output slots, changed inputs."""

    outputs: dict[str, torch.Tensor]
    problems: list[str] = field(default_factory=list)


def execute(ops: OpDispatcher, case: Case, args: dict[str, Any]) -> Execution:
    """Call `case.op` on `ops` with `args` (fresh copies on the backend's device;
    mutated operands are moved into guarded buffers; `case.prepared` weights in the
    backend's load-time form). ContractError and kernel exceptions propagate."""
    contract = case.contract
    output_names = tuple(spec.name for spec in contract.outputs)
    allocator = PoisonAllocator(output_names)
    mutated = [s.name for s in contract.tensors if s.mutated and args.get(s.name) is not None]
    for name in mutated:
        args[name] = allocator.adopt(name, args[name])
    inputs = {k: v.clone() for k, v in args.items() if isinstance(v, torch.Tensor) and k not in mutated}
    # A prepared weight is the backend's own (possibly opaque) form; the plain tensor it
    # was made from is the input that must come back unchanged.
    plain = dict(args)
    for name in case.prepared:
        args[name] = ops.prepare_linear_weight(args[name])
    ops.allocator = allocator
    returned = ops.call(contract, (), args)
    values = returned if isinstance(returned, tuple) else () if returned is None else (returned,)
    outputs = dict(zip(output_names, values))
    problems = allocator.breaches()
    problems += [
        f"{name}: {unwritten} of {tensor.numel()} elements never written (still poison)"
        for name, tensor in outputs.items()
        if (unwritten := count_poisoned(tensor))
    ]
    problems += [
        f"{name}: input modified in place" for name, tensor in inputs.items() if not same_bits(tensor, plain[name])
    ]
    outputs.update({name: args[name] for name in mutated})
    return Execution({name: tensor.cpu() for name, tensor in outputs.items()}, problems)
