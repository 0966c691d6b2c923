"""Deliberately broken backends for conformance's own tests: each is the reference
backend with one kernel swapped for a plausible bug, so a test can show the bug is
caught and everything else still passes."""

from __future__ import annotations

import dataclasses
from typing import Any

import torch

from accord.backends import Backend, ToleranceOverride, get_backend
from accord.op_contracts import Kernel, KernelSet


class PatchedReference(Backend):
    """The reference kernels, except the ones given (keyed by op), under a new name."""

    device_type = "cpu"

    def __init__(
        self,
        name: str,
        *replacements: Kernel,
        missing: tuple[str, ...] = (),
        nondeterministic: tuple[str, ...] = (),
        batch_variant: tuple[str, ...] = (),
    ) -> None:
        super().__init__()
        self.name = name
        self._replacements = replacements
        self._missing = missing
        self._nondeterministic = frozenset(nondeterministic)
        self._batch_variant = frozenset(batch_variant)

    def load_kernels(self) -> KernelSet:
        # Each kernel runs through its own function, so conformance judges the double
        # as a backend of its own rather than reporting the reference's kernels shared.
        kernels = KernelSet()
        for op, kernel in get_backend("reference").kernels().as_dict().items():
            if op not in self._missing:
                kernels.add(dataclasses.replace(kernel, fn=own_function(kernel.fn)))
        for kernel in self._replacements:
            kernels.add(dataclasses.replace(kernel, fn=own_function(kernel.fn)))
        return kernels

    def nondeterministic_ops(self) -> frozenset[str]:
        return self._nondeterministic

    def batch_variant_ops(self) -> frozenset[str]:
        return get_backend("reference").batch_variant_ops() | self._batch_variant


def own_function(fn: Any) -> Any:
    """`fn` behind a function object of its own (same behaviour, another identity)."""
    return lambda **call: fn(**call)


def reference_fn(op: str) -> Any:
    """The reference backend's kernel function for `op`."""
    return get_backend("reference").kernel_for(op).fn


def route_reading_companions_at_token_id_width(**call: Any) -> None:
    """The motivating crash: the kernel takes its index width from token_ids and reads
    the hash table at that width, whatever the table's own dtype."""
    if call["hash_table"] is not None:
        call["hash_table"] = call["hash_table"].view(call["token_ids"].dtype)
    reference_fn("moe_route")(**call)


def route_without_renormalisation(**call: Any) -> None:
    """Forgets to divide the top-k weights by their sum."""
    reference_fn("moe_route")(**{**call, "renormalize": False})


def rms_norm_writing_half_the_columns(x: torch.Tensor, weight: torch.Tensor, eps: float, out: torch.Tensor) -> None:
    """Writes only the first half of each output row (a wrong loop bound)."""
    full = torch.empty_like(out)
    reference_fn("rms_norm")(x=x, weight=weight, eps=eps, out=full)
    half = out.shape[1] // 2
    out[:, :half] = full[:, :half]


def rms_norm_writing_past_its_output(x: torch.Tensor, weight: torch.Tensor, eps: float, out: torch.Tensor) -> None:
    """Correct values, plus one element stored just past the end of the buffer."""
    reference_fn("rms_norm")(x=x, weight=weight, eps=eps, out=out)
    torch.as_strided(out, (out.numel() + 1,), (1,))[-1] = 0


def rms_norm_off_by_a_thousandth(x: torch.Tensor, weight: torch.Tensor, eps: float, out: torch.Tensor) -> None:
    """Every value 0.1% high: far outside the fp32 bound, inside a declared 1e-4."""
    reference_fn("rms_norm")(x=x, weight=weight, eps=eps, out=out)
    out.mul_(1.001)


def rms_norm_with_noise(x: torch.Tensor, weight: torch.Tensor, eps: float, out: torch.Tensor) -> None:
    """Correct within tolerance, but fresh noise every call (a racy reduction)."""
    reference_fn("rms_norm")(x=x, weight=weight, eps=eps, out=out)
    out.mul_(1 + 1e-7 * torch.randn(out.shape))


def rms_norm_depending_on_batch_size(x: torch.Tensor, weight: torch.Tensor, eps: float, out: torch.Tensor) -> None:
    """Correct within tolerance, but each row's rounding depends on the batch size
    (a kernel that picks its reduction split by the number of rows)."""
    reference_fn("rms_norm")(x=x, weight=weight, eps=eps, out=out)
    out.mul_(1 + 1e-7 * x.shape[0])


class WideToleranceBackend(PatchedReference):
    """Declares a wider rms_norm tolerance, as a backend with a known rounding mode would."""

    def tolerance_override(self, op: str, dtype: torch.dtype) -> ToleranceOverride | None:
        if op == "rms_norm":
            return ToleranceOverride(1e-4, "test double: values rounded 0.1% high")
        return None


def broken(name: str, op: str, fn: Any, declares: str = "", **claims: tuple[torch.dtype, ...]) -> PatchedReference:
    """The reference backend with `op`'s kernel replaced by `fn` (claiming `claims`);
    `declares` may name `nondeterministic` or `batch_variant` for the op."""
    return PatchedReference(name, Kernel(op, fn, claims), **({declares: (op,)} if declares else {}))
