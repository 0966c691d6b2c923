"""The one door between the core and any kernel: `ops.<name>(...)`.

On first sight of a call signature the dispatcher validates the call against the op's
contract and the backend's declared support, works out the boundary adapters to apply,
and caches that plan. `ops.<name>` is an `OpHandle` bound to one op, and every call of
an op goes through it, one way: a call of a signature (and a form: how many positional
arguments, which keywords) the handle has seen runs that signature's fast path
(fast_path.py: a guard, the output allocation and the kernel call); any other call is
bound, validated on first sight (refused with ContractError where the contract or the
backend says no), planned and run. In strict mode (`ACCORD_STRICT_CONTRACTS=1`, tests,
conformance) every call is validated. Nothing falls back to another backend: a backend
missing an op raises.

A model whose forward is compiled is built on a dispatcher made with `compiled=True`,
the same ops object it runs on eagerly: while torch.compile traces, a handle's call
becomes that op's torch.library custom op (torch_ops.py), opaque to the compiler, whose
implementation calls the handle again when the compiled graph runs. Nothing in the
model is swapped for compiling.

A `CallHook` installed on a dispatcher (`add_hook`) sees every call of that dispatcher,
with its arguments as the caller made them, before any adapter or kernel runs (so a
call whose kernel crashes is seen too); the rollout gate records op signatures this
way. While a hook is installed calls take the full path; without one the fast path's
only extra cost is three truth tests (compiled, strict, hooks).
"""

from __future__ import annotations

import logging
import os
from collections import Counter
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Callable, Mapping, Protocol

import torch
from torch.compiler import is_compiling

from . import torch_ops
from .contracts import CONTRACTS
from .errors import ContractError
from .fast_path import MAX_FAST_PATHS, MISS, fast_path
from .kernel import CallSignature, CastAdapter, Kernel, TensorKey
from .spec import REQUIRED, OpContract, OutputSpec, dtype_name, shape_dims
from .validate import SizeStep, describe_tensor, replay_sizes, validate_call

if TYPE_CHECKING:
    # Type checkers and editors see every op as a typed method (generated from the
    # contracts); at run time `__getattr__` serves each op through an OpHandle.
    from .typed_ops import Ops as _TypedOps
else:
    _TypedOps = object

logger = logging.getLogger("accord.contracts")

Allocator = Callable[[tuple[int, ...], torch.dtype, torch.device], torch.Tensor]


class KernelProvider(Protocol):
    """What the dispatcher needs of a backend: its name, device type and kernels."""

    name: str
    device_type: str

    def kernel_for(self, op: str, batch_invariant: bool = False) -> Kernel | None: ...


class CallHook(Protocol):
    """Observes a dispatcher's calls: `hook(op, call)` with the bound arguments (contract
    names to values, outputs not yet allocated), before adapters and the kernel. A hook
    must not change `call`."""

    def __call__(self, op: str, call: Mapping[str, Any]) -> None: ...


def empty_allocator(shape: tuple[int, ...], dtype: torch.dtype, device: torch.device) -> torch.Tensor:
    """The production allocator: uninitialised memory (kernels write every element)."""
    return torch.empty(shape, dtype=dtype, device=device)


def strict_from_env() -> bool:
    """Whether ACCORD_STRICT_CONTRACTS asks for every call to be validated."""
    return os.environ.get("ACCORD_STRICT_CONTRACTS", "0") not in ("", "0", "false", "False")


@dataclass(frozen=True)
class CallPlan:
    """What first sight of a signature decided: the kernel, and the casts to apply."""

    signature: CallSignature
    kernel: Kernel
    adapters: tuple[CastAdapter, ...]
    size_steps: tuple[SizeStep, ...]
    #: Per output: (name, parsed dims, dtype source) for the calls of this signature.
    outputs: tuple[tuple[str, tuple[Any, ...], OutputSpec], ...]


class OpDispatcher(_TypedOps):
    """Calls ops on one backend through their contracts: `ops.rms_norm(x, w, eps=1e-6)`.

    Arguments bind positionally in contract order (tensors, then parameters) or by
    name. Outputs are allocated here at the contract's dtype and returned: one tensor,
    a tuple in contract order, or None for ops that only write a cache.
    """

    def __init__(
        self,
        backend: KernelProvider,
        *,
        strict: bool | None = None,
        allocator: Allocator = empty_allocator,
        contracts: Mapping[str, OpContract] = CONTRACTS,
        compiled: bool = False,
        batch_invariant: bool = False,
    ) -> None:
        self.backend = backend
        #: Whether only batch-invariant kernels run (`--batch-invariant`).
        self.batch_invariant = batch_invariant
        self.strict = strict_from_env() if strict is None else strict
        self.allocator = allocator
        self.contracts = contracts
        self.adapter_counts: Counter[str] = Counter()
        self._plans: dict[tuple[Any, ...], CallPlan] = {}
        self._callers: dict[str, OpHandle] = {}
        #: The installed hooks; empty (falsy) keeps handles on their fast paths.
        self.hooks: tuple[CallHook, ...] = ()
        #: Whether a torch.compile'd forward calls these ops: traced calls then become
        #: the contracts' custom ops (registered here), found again by `key`.
        self.compiled = compiled
        self.key = torch_ops.register_dispatcher(self, contracts) if compiled else None

    def add_hook(self, hook: CallHook) -> None:
        """Have `hook` see every later call of this dispatcher (and of no other)."""
        self.hooks = (*self.hooks, hook)

    def remove_hook(self, hook: CallHook) -> None:
        """Stop `hook` seeing calls; calls return to their fast paths once none is left."""
        self.hooks = tuple(h for h in self.hooks if h is not hook)

    def __getattr__(self, op: str) -> "OpHandle":
        if op.startswith("_"):
            raise AttributeError(op)
        try:
            return self._callers[op]
        except KeyError:
            pass
        contract = self.contracts.get(op)
        if contract is None:
            raise AttributeError(f"no op contract named {op!r}; known: {', '.join(sorted(self.contracts))}")
        handle = self._callers[op] = OpHandle(self, contract)
        return handle

    def prepare_linear_weight(self, weight: torch.Tensor) -> torch.Tensor:
        """The backend's load-time form of a dense weight for `linear` (prepacked, say);
        a provider without the hook keeps the weight as it is."""
        prepare = getattr(self.backend, "prepare_linear_weight", None)
        return weight if prepare is None else prepare(weight)

    def bind(self, contract: OpContract, args: tuple[Any, ...], kwargs: Mapping[str, Any]) -> dict[str, Any]:
        """Map positional and keyword arguments to contract names, filling defaults."""
        names = contract.arg_names
        if len(args) > len(names):
            raise ContractError(contract.name, "arguments", f"at most {len(names)}", str(len(args)))
        call = dict(zip(names, args))
        for name, value in kwargs.items():
            if name not in names:
                raise ContractError(contract.name, name, f"one of {', '.join(names)}", "an unknown argument")
            if name in call:
                raise ContractError(contract.name, name, "one value", "given positionally and by name")
            call[name] = value
        for spec in contract.tensors:
            call.setdefault(spec.name, None)
        for spec in contract.params:
            if spec.name not in call:
                if spec.default is REQUIRED:
                    raise ContractError(contract.name, spec.name, "a value", "absent")
                call[spec.name] = spec.default
        return call

    def call(self, contract: OpContract, args: tuple[Any, ...], kwargs: Mapping[str, Any]) -> Any:
        """Validate (first sight or strict), adapt, allocate outputs, run the kernel."""
        call = self.bind(contract, args, kwargs)
        return self._run(contract, self.plan_of(contract, call), call)

    def plan_of(self, contract: OpContract, call: dict[str, Any]) -> CallPlan:
        """The cached plan of a bound call's signature, made (and validated) on first
        sight; strict mode validates every call."""
        key = self._signature_key(contract, call)
        plan = self._plans.get(key)
        if plan is None:
            plan = self._first_sight(contract, call)
            self._plans[key] = plan
        elif self.strict:
            self._validate(contract, call)
        return plan

    def _run(self, contract: OpContract, plan: CallPlan, call: dict[str, Any]) -> Any:
        for hook in self.hooks:
            hook(contract.name, call)
        for adapter in plan.adapters:
            call[adapter.arg] = call[adapter.arg].to(adapter.to)
            self.adapter_counts[f"{contract.name}.{adapter.arg}"] += 1
        outputs = self._allocate_outputs(contract, plan, call)
        call.update(outputs)
        plan.kernel.fn(**call)
        if not outputs:
            return None
        values = tuple(outputs.values())
        return values[0] if len(values) == 1 else values

    def plan_for(self, op: str, *args: Any, **kwargs: Any) -> CallPlan:
        """Validate a call without running it and return its plan (conformance uses this
        to check that illegal or unclaimed calls are refused)."""
        contract = self.contracts[op]
        return self._first_sight(contract, self.bind(contract, args, kwargs))

    def _signature_key(self, contract: OpContract, call: Mapping[str, Any]) -> tuple[Any, ...]:
        key: list[Any] = [contract.name]
        for spec in contract.tensors:
            value = call[spec.name]
            if isinstance(value, torch.Tensor):
                key.append(tensor_key(value))
            else:
                key.append(value if value is None else type(value))
        for spec in contract.params:
            if spec.in_signature:
                key.append(call[spec.name])
        return tuple(key)

    def _validate(self, contract: OpContract, call: Mapping[str, Any]) -> tuple[SizeStep, ...]:
        try:
            steps = validate_call(contract, call)
        except ContractError as error:
            raise ContractError(
                error.op, error.arg, error.expected, error.got, self.backend.name, error.hint
            ) from None
        for spec in contract.tensors:
            value = call[spec.name]
            if value is not None and value.device.type != self.backend.device_type:
                raise ContractError(
                    contract.name,
                    spec.name,
                    f"a tensor on {self.backend.device_type}",
                    describe_tensor(value),
                    self.backend.name,
                )
        return steps

    def _first_sight(self, contract: OpContract, call: Mapping[str, Any]) -> CallPlan:
        steps = self._validate(contract, call)
        signature = CallSignature(
            contract.name,
            tuple((s.name, None if call[s.name] is None else tensor_key(call[s.name])) for s in contract.tensors),
            tuple((p.name, call[p.name]) for p in contract.params if p.in_signature),
        )
        outputs = tuple((o.name, shape_dims(o.shape, call), o) for o in contract.outputs)
        if self.batch_invariant:
            kernel = self.backend.kernel_for(contract.name, batch_invariant=True)
        else:
            kernel = self.backend.kernel_for(contract.name)
        if kernel is None and self.batch_invariant:
            raise ContractError(
                contract.name, "op", "a batch-invariant kernel", "none", self.backend.name,
                hint=f"batch-invariant mode runs only kernels conformance checks batch invariant, and this backend has "
                f"none for {contract.name}; turn --batch-invariant off or pick a backend that has one",
            )
        if kernel is None:
            raise ContractError(
                contract.name,
                "op",
                "a kernel for this op",
                "none",
                self.backend.name,
                hint="this backend does not implement it; pick a backend that does (no silent fallback)",
            )
        refusal = kernel.refusal(signature)
        if refusal is None:
            return CallPlan(signature, kernel, (), steps, outputs)
        adapted, adapters = signature, []
        for adapter in kernel.adapters:
            got = adapted.dtype(adapter.arg)
            if got is not None and got != adapter.to:
                adapted = adapted.with_dtype(adapter.arg, adapter.to)
                adapters.append(adapter)
        if adapters and kernel.refusal(adapted) is None:
            applied = ", ".join(a.describe(signature.dtype(a.arg)) for a in adapters)  # type: ignore[arg-type]
            logger.warning("%s on backend '%s': applying declared adapter: %s", contract.name, self.backend.name, applied)
            return CallPlan(signature, kernel, tuple(adapters), steps, outputs)
        arg = refusal.split(" ", 1)[0]
        raise ContractError(
            contract.name,
            arg if arg in contract.arg_names else "signature",
            "a signature the backend claims",
            f"{signature.describe()} ({refusal})",
            self.backend.name,
        )

    def _allocate_outputs(
        self, contract: OpContract, plan: CallPlan, call: Mapping[str, Any]
    ) -> dict[str, torch.Tensor]:
        if not plan.outputs:
            return {}
        sizes = replay_sizes(contract, plan.size_steps, call)
        device = call[contract.primary].device
        return {
            name: self.allocator(tuple(d.evaluate(sizes) for d in dims), spec.dtype_of(call), device)
            for name, dims, spec in plan.outputs
        }


class OpHandle:
    """`ops.<name>`: the dispatcher bound to one op. Keep it at the call site: after the
    first call of a signature, calls of that signature in the same form (positional
    arity and keyword names) run its fast path."""

    def __init__(self, dispatcher: OpDispatcher, contract: OpContract) -> None:
        self.dispatcher = dispatcher
        self.contract = contract
        self.__name__ = contract.name
        self.__doc__ = contract.doc
        self._paths: list[Callable[[tuple[Any, ...], dict[str, Any]], Any]] = []

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        dispatcher = self.dispatcher
        if dispatcher.compiled and is_compiling():
            return torch_ops.traced_call(dispatcher, self.contract, args, kwargs)
        if dispatcher.strict or dispatcher.hooks:
            return dispatcher.call(self.contract, args, kwargs)
        for path in self._paths:
            result = path(args, kwargs)
            if result is not MISS:
                return result
        call = dispatcher.bind(self.contract, args, kwargs)
        plan = dispatcher.plan_of(self.contract, call)
        if not plan.adapters and len(self._paths) < MAX_FAST_PATHS:
            allocator = None if dispatcher.allocator is empty_allocator else dispatcher.allocator
            self._paths.append(fast_path(
                self.contract, plan, call, len(args), tuple(kwargs), dispatcher.backend.device_type, allocator
            ))
        return dispatcher._run(self.contract, plan, call)

    @property
    def fast_paths(self) -> int:
        """How many signatures this handle has compiled a fast path for."""
        return len(self._paths)

    def __repr__(self) -> str:
        return f"<op {self.contract.name} on {self.dispatcher.backend.name}>"


def tensor_key(value: torch.Tensor) -> TensorKey:
    """One tensor's part of a call signature: (dtype, rank, device type, contiguous)."""
    return (value.dtype, value.dim(), value.device.type, value.is_contiguous())


__all__ = ["CallHook", "OpDispatcher", "OpHandle", "CallPlan", "empty_allocator", "strict_from_env", "dtype_name"]
