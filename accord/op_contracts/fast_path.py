"""The steady-state call of one op signature, generated as one Python function.

A call site's `OpHandle` (dispatcher.py) keeps, per signature it has seen (in the form
the call site makes it: positional arity and keyword names), a function that guards
the call's signature, allocates the outputs and calls the kernel, skipping binding and
validation. It pays: on benchmarks/dispatch_overhead.py a decode-sized rms_norm costs
the fast path a fraction of the full path's bind and signature lookup (the numbers are
in docs/architecture.md). A call of any other signature misses every guard and takes the
full path, so it is validated exactly as on first sight.
"""

from __future__ import annotations

import ast
from typing import TYPE_CHECKING, Any, Callable, Mapping

import torch

from .shapes import cdiv
from .spec import OpContract, OutputSpec

if TYPE_CHECKING:
    from .dispatcher import Allocator, CallPlan


#: What a fast path returns when the call is not of its signature.
MISS: Any = object()
#: Signatures one handle keeps fast paths for (a call site sees one or two).
MAX_FAST_PATHS = 4


def fast_path(
    contract: OpContract, plan: CallPlan, call: Mapping[str, Any], arity: int, keywords: tuple[str, ...],
    device_type: str, allocator: Allocator | None,
) -> Callable[[tuple[Any, ...], dict[str, Any]], Any]:
    """Compile the steady-state call of `plan`'s signature in the form of the bound call
    `call` that made it (`arity` arguments positional, then the ones named `keywords`):
    a guard (the same
    arity and keyword names; per tensor: presence, dtype, rank, contiguity, device type;
    code-path parameter values; other parameters' types) that returns MISS when the call
    is of another signature or form, then the sizes the outputs need (as validation
    learned them), the output allocation and the kernel call. Generated as one Python
    function, because every generic step (binding a dict, looping over specs) costs
    about a microsecond. Outputs live on `device_type`; `allocator` is the dispatcher's
when it is not the production one (None: torch allocates directly)."""
    positional = contract.arg_names[:arity]
    names = (*positional, *keywords)
    int_params = {p.name for p in contract.params if p.type is int}
    env: dict[str, Any] = {
        "MISS": MISS, "Tensor": torch.Tensor, "kernel": plan.kernel.fn, "allocator": allocator, "cdiv": cdiv,
        "empty": torch.empty, "empty_like": torch.empty_like,
    }
    device_check = {"cpu": "{0}.is_cpu", "cuda": "{0}.is_cuda"}.get(
        device_type, "{0}.device.type == " + repr(device_type)
    )
    form_check = f"len(args) != {len(positional)} or len(kwargs) != {len(keywords)}"
    lines = ["def fast(args, kwargs):", f"    if {form_check}: return MISS"]
    if positional:
        lines.append(f"    {', '.join(positional)}{',' if len(positional) == 1 else ''} = args")
    if keywords:
        # The same count of keywords, all of these names: exactly the form compiled.
        lines.append("    try:")
        lines.extend(f"        {name} = kwargs[{name!r}]" for name in keywords)
        lines.append("    except KeyError: return MISS")
    for index, spec in enumerate(contract.tensors):
        key = dict(plan.signature.tensors)[spec.name]
        if spec.name not in names:
            continue  # absent: the default (None), as in the signature
        if key is None:
            lines.append(f"    if {spec.name} is not None: return MISS")
            continue
        dtype, rank, _, contiguous = key
        env[f"dtype_{index}"] = dtype
        checks = [
            f"{spec.name}.__class__ is not Tensor",
            f"{spec.name}.dtype is not dtype_{index}",
            f"{spec.name}.dim() != {rank}",
            f"{'not ' if contiguous else ''}{spec.name}.is_contiguous()",
            "not " + device_check.format(spec.name),
        ]
        lines.append(f"    if {' or '.join(checks)}: return MISS")
    signature_params = dict(plan.signature.params)
    for spec in contract.params:
        if spec.name not in names:
            continue
        if spec.name in signature_params:
            env[f"value_{spec.name}"] = signature_params[spec.name]
            lines.append(f"    if {spec.name} != value_{spec.name}: return MISS")
        else:
            env[f"type_{spec.name}"] = type(call[spec.name])
            lines.append(f"    if {spec.name}.__class__ is not type_{spec.name}: return MISS")
    defaults = [s.name for s in contract.tensors if s.name not in names]
    defaults += [p.name for p in contract.params if p.name not in names]
    for name in defaults:
        env[f"default_{name}"] = None if name in {s.name for s in contract.tensors} else contract.param(name).default
        lines.append(f"    {name} = default_{name}")
    outputs, allocations = [], []
    for number, (name, dims, spec) in enumerate(plan.outputs):
        shape = ", ".join(_symbols_to_locals(d.text, int_params) for d in dims)
        shape = f"({shape}{',' if len(dims) == 1 else ''})"
        if isinstance(spec.dtype, torch.dtype):
            env[f"out_dtype_{number}"] = spec.dtype
            dtype_expr = f"out_dtype_{number}"
        else:
            dtype_expr = _dtype_expression(spec.dtype_sources())
        outputs.append(name)
        allocations.append(f"    {name} = {_allocation(contract, plan, spec, shape, dtype_expr, device_type, allocator)}")
    # Only the sizes the allocations read (and the ones solving them needs) are taken.
    used = " ".join(allocations)
    needed = max((n + 1 for n, (symbol, *_) in enumerate(plan.size_steps) if f"s_{symbol}" in used), default=0)
    for number, (symbol, tensor, axis, dim) in enumerate(plan.size_steps[:needed]):
        size = f"{tensor}.shape[{axis}]"
        if dim.text == symbol:
            lines.append(f"    s_{symbol} = {size}")
        else:
            env[f"dim_{number}"] = dim
            known = ", ".join([f"{s!r}: s_{s}" for s, *_ in plan.size_steps[:number]] + [f"{p!r}: {p}" for p in int_params])
            lines.append(f"    s_{symbol} = dim_{number}.solve({size}, {{{known}}})[1]")
    lines.extend(allocations)
    kernel_args = ", ".join(f"{n}={n}" for n in (*contract.arg_names, *outputs))
    lines.append(f"    kernel({kernel_args})")
    lines.append(f"    return {'None' if not outputs else outputs[0] if len(outputs) == 1 else '(' + ', '.join(outputs) + ',)'}")
    source = "\n".join(lines)
    exec(compile(source, f"<fast path {contract.name}: {plan.signature.describe()}>", "exec"), env)
    return env["fast"]


def _allocation(
    contract: OpContract, plan: CallPlan, spec: OutputSpec, shape: str, dtype: str, device_type: str,
    allocator: Allocator | None,
) -> str:
    """The expression that allocates one output in a fast path. With the production
    allocator torch is called directly (a Python call less), and an output shaped and
    typed like a contiguous input is `empty_like` of it, the cheapest allocation torch
    has (the guard has checked that input's contiguity)."""
    if allocator is not None:
        return f"allocator({shape}, {dtype}, {contract.primary}.device)"
    keys = dict(plan.signature.tensors)
    for tensor in contract.tensors:
        key = keys[tensor.name]
        if key is not None and key[3] and tensor.shape == spec.shape and spec.dtype == f"like:{tensor.name}":
            return f"empty_like({tensor.name})"
    device = "" if device_type == "cpu" else f", device={contract.primary}.device"
    return f"empty({shape}, dtype={dtype}{device})"


def _symbols_to_locals(text: str, int_params: set[str]) -> str:
    """A dimension expression over the generated function's locals: symbol S is `s_S`,
    an int parameter is its own argument."""
    tree = ast.parse(text, mode="eval")
    for node in ast.walk(tree):
        if isinstance(node, ast.Name) and node.id != "cdiv" and node.id not in int_params:
            node.id = f"s_{node.id}"
    return ast.unparse(tree)


def _dtype_expression(sources: tuple[tuple[str, str], ...]) -> str:
    """An output's dtype over the fast path's locals: `x.dtype`, `out_dtype`, or
    `(out_dtype if out_dtype is not None else x.dtype)` for a parameter that may be None."""
    kind, name = sources[0]
    first = f"{name}.dtype" if kind == "like" else name
    if len(sources) == 1:
        return first
    return f"({first} if {first} is not None else {_dtype_expression(sources[1:])})"
