"""What a backend hands the dispatcher for one op: the kernel, its claims and adapters."""

from __future__ import annotations

import dataclasses

import inspect
from dataclasses import dataclass, field
from typing import Any, Callable, Mapping

import torch

from .contracts import CONTRACTS
from .spec import OpContract, dtype_name

#: One tensor's part of a call signature: (dtype, rank, device type, contiguous).
TensorKey = tuple[torch.dtype, int, str, bool] | None


@dataclass(frozen=True)
class CallSignature:
    """What the dispatcher caches a validated call on: per-tensor dtype, rank, device
    and contiguity, plus the values of code-path parameters (those with choices)."""

    op: str
    tensors: tuple[tuple[str, TensorKey], ...]
    params: tuple[tuple[str, Any], ...]

    def dtype(self, arg: str) -> torch.dtype | None:
        """The dtype of tensor `arg` in this call, or None when it was not passed."""
        for name, key in self.tensors:
            if name == arg:
                return None if key is None else key[0]
        raise KeyError(arg)

    def param(self, name: str) -> Any:
        """The value of code-path parameter `name` in this call."""
        return dict(self.params)[name]

    def with_dtype(self, arg: str, dtype: torch.dtype) -> "CallSignature":
        """This signature with tensor `arg` at another dtype (what an adapter produces)."""
        tensors = tuple(
            (name, (dtype, *key[1:]) if name == arg and key is not None else key)
            for name, key in self.tensors
        )
        return CallSignature(self.op, tensors, self.params)

    def describe(self) -> str:
        """A short human form, `x=bf16[2] weight=bf16[1] eps`."""
        parts = [
            f"{name}={dtype_name(key[0])}[{key[1]}]" for name, key in self.tensors if key is not None
        ]
        parts += [f"{name}={value}" for name, value in self.params]
        return " ".join(parts)


@dataclass(frozen=True)
class CastAdapter:
    """A declared boundary cast: the kernel takes `arg` only at `to`, so the dispatcher
    converts it before the call. Applied visibly: logged once and counted."""

    arg: str
    to: torch.dtype

    def describe(self, got: torch.dtype) -> str:
        return f"cast {self.arg} {dtype_name(got)}->{dtype_name(self.to)}"


@dataclass(frozen=True)
class Kernel:
    """A backend's implementation of one op.

    `fn` is called with every tensor argument, parameter and pre-allocated output as
    keyword arguments and writes its outputs in place. `claims` narrows the dtypes the
    kernel takes per argument (absent: every dtype the contract allows); `supports`
    may refuse further signatures with a reason, like llama.cpp's `supports_op`.
    `batch_invariant` claims each row's result never depends on the rows beside it
    (a fixed reduction order whatever the row count): conformance's batch-invariant
    run checks the claim, and `--batch-invariant` admits only kernels that make it.
    """

    op: str
    fn: Callable[..., None]
    claims: Mapping[str, tuple[torch.dtype, ...]] = field(default_factory=dict)
    supports: Callable[[CallSignature], str | None] | None = None
    adapters: tuple[CastAdapter, ...] = ()
    batch_invariant: bool = False

    def refusal(self, signature: CallSignature) -> str | None:
        """Why this kernel will not run `signature`, or None when it will."""
        for arg, dtypes in self.claims.items():
            got = signature.dtype(arg)
            if got is not None and got not in dtypes:
                claimed = "/".join(dtype_name(d) for d in dtypes)
                return f"{arg} is {dtype_name(got)} but the kernel claims {claimed} only"
        if self.supports is not None:
            return self.supports(signature)
        return None


class KernelSignatureError(TypeError):
    """A kernel registered for an op whose parameters are not the contract's argument
    and output names (a renamed, missing or extra argument): raised at registration,
    long before the dispatcher's keyword call would fail mid-step."""


def kernel_parameter_names(contract: OpContract) -> tuple[str, ...]:
    """What the dispatcher passes a kernel of `contract`, by keyword: every tensor
    argument and parameter in contract order, then every pre-allocated output."""
    return (*contract.arg_names, *(o.name for o in contract.outputs))


def signature_mismatch(contract: OpContract, fn: Callable[..., None]) -> str | None:
    """Why `fn` cannot be `contract`'s kernel, or None when its parameters are exactly
    the contract's names. A `**kwargs` catch-all (a forwarding wrapper, a recorder)
    takes every name it does not list; a positional-only parameter takes none."""
    wanted = kernel_parameter_names(contract)
    parameters = inspect.signature(fn).parameters.values()
    named = {p.name for p in parameters if p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY)}
    catch_all = any(p.kind is p.VAR_KEYWORD for p in parameters)
    problems = []
    missing = [name for name in wanted if name not in named]
    if missing and not catch_all:
        problems.append(f"missing {', '.join(missing)}")
    extra = sorted(named - set(wanted))
    if extra:
        problems.append(f"extra {', '.join(extra)}")
    positional = [p.name for p in parameters if p.kind is p.POSITIONAL_ONLY]
    if positional:
        problems.append(f"positional-only {', '.join(positional)}")
    return "; ".join(problems) or None


class KernelSet:
    """A backend's table of kernels, filled with the `register` decorator. Every kernel
    is checked against its op's contract as it joins (`KernelSignatureError`), so a
    kernel whose parameter names drifted from the contract fails at import, naming the
    backend, the op and the names."""

    def __init__(self, backend: str = "", contracts: Mapping[str, OpContract] = CONTRACTS) -> None:
        #: The backend this table belongs to, as registration errors name it.
        self.backend = backend
        self.contracts = contracts
        self._kernels: dict[str, Kernel] = {}
        #: Batch-invariant variants of ops whose default kernel is not invariant.
        self._invariant: dict[str, Kernel] = {}

    def check(self, op: str, fn: Callable[..., None]) -> None:
        """Refuse `fn` as the kernel of `op` unless `op` has a contract and `fn` takes
        exactly its argument and output names (KernelSignatureError)."""
        owner = f"backend '{self.backend}'" if self.backend else "an unnamed kernel set"
        contract = self.contracts.get(op)
        if contract is None:
            raise KernelSignatureError(f"{owner}: a kernel for {op!r}, which no op contract defines")
        mismatch = signature_mismatch(contract, fn)
        if mismatch is not None:
            raise KernelSignatureError(
                f"{owner}: the {op} kernel {getattr(fn, '__qualname__', fn)!r} does not take the contract's "
                f"arguments: {mismatch}. A kernel is called with every argument and output by name: "
                f"{', '.join(kernel_parameter_names(contract))}"
            )

    def register(
        self,
        op: str,
        *,
        claims: Mapping[str, tuple[torch.dtype, ...]] | None = None,
        supports: Callable[[CallSignature], str | None] | None = None,
        adapters: tuple[CastAdapter, ...] = (),
        batch_invariant: bool = False,
        invariant_variant: bool = False,
    ) -> Callable[[Callable[..., None]], Callable[..., None]]:
        """Decorator: make the function the kernel for `op` (claiming batch invariance
        with `batch_invariant`), or with `invariant_variant` the batch-invariant kernel
        `--batch-invariant` runs instead of the op's default one."""

        def decorate(fn: Callable[..., None]) -> Callable[..., None]:
            table = self._invariant if invariant_variant else self._kernels
            if op in table:
                raise ValueError(f"kernel for {op} registered twice")
            self.check(op, fn)
            table[op] = Kernel(op, fn, dict(claims or {}), supports, adapters, batch_invariant or invariant_variant)
            return fn

        return decorate

    def add(self, kernel: Kernel) -> None:
        """Register an already built kernel (a backend reusing another's)."""
        self.check(kernel.op, kernel.fn)
        self._kernels[kernel.op] = kernel

    def get(self, op: str) -> Kernel | None:
        return self._kernels.get(op)

    def invariant(self, op: str) -> Kernel | None:
        """The batch-invariant kernel of `op`: its variant, or the default kernel where
        that claims invariance; None when there is neither."""
        default = self._kernels.get(op)
        return self._invariant.get(op) or (default if default is not None and default.batch_invariant else None)

    def add_invariant(self, kernel: Kernel) -> None:
        """Register an already built batch-invariant variant (a backend reusing another's)."""
        self.check(kernel.op, kernel.fn)
        self._invariant[kernel.op] = dataclasses.replace(kernel, batch_invariant=True)

    def ops(self) -> tuple[str, ...]:
        return tuple(sorted(self._kernels))

    def as_dict(self) -> dict[str, Kernel]:
        return dict(self._kernels)
