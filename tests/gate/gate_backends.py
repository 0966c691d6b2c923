"""Test backend plugins for the gate's tests: the reference kernels with one injected
bug (one of them only on the expert-parallel path), or with KV cache writers that
refuse fp8 caches. They register through the real
plugin hook (`accord_backends`), so the gate finds them as it finds a vendor package."""

from __future__ import annotations

import dataclasses
from typing import Any, Callable

import torch

from accord.backends import Backend, hookimpl
from accord.backends.reference import ReferenceBackend
from accord.op_contracts import CallSignature, Kernel, KernelSet

BUGGY_BACKEND = "gate-buggy"
NO_FP8_CACHE_BACKEND = "gate-no-fp8-cache"
CRASHING_BACKEND = "gate-crashing"
EP_INDEX_BACKEND = "gate-ep-index-width"
LORA_BUGGY_BACKEND = "gate-lora-buggy"
#: The op whose kernel carries the injected bug (and, on the crashing backend, the crash).
BUGGY_OP = "silu_and_mul"
#: The crashing kernel takes at most this many rows: fewer than profile_run's batch.
CRASH_ABOVE_ROWS = 16
CACHE_WRITERS = ("reshape_and_cache", "concat_and_cache_mla")


class ReferenceVariant(Backend):
    """The reference backend's kernels under another name, changed by `patch`. The
    kernels load lazily: a plugin must not build backends while the registry forms."""

    device_type = "cpu"

    def __init__(self, name: str, patch: Callable[[KernelSet], None]) -> None:
        super().__init__()
        self.name = name
        self._patch = patch

    def load_kernels(self) -> KernelSet:
        kernels = KernelSet()
        for kernel in ReferenceBackend().kernels().as_dict().values():
            kernels.add(kernel)
        self._patch(kernels)
        return kernels


def silu_and_mul_off_by_a_tenth(kernels: KernelSet) -> None:
    """silu(gate) * up, ten percent too large: a wrong constant in a fused kernel."""
    correct = kernels.get(BUGGY_OP).fn

    def buggy(**call: Any) -> None:
        correct(**call)
        call["out"].mul_(1.1)

    kernels.add(Kernel(BUGGY_OP, buggy))


def silu_and_mul_crashing_on_big_batches(kernels: KernelSet) -> None:
    """Fine on small batches, a crash on profile_run's: an overflowing index width in
    a vendor kernel, the way the motivating incident failed before any token."""
    correct = kernels.get(BUGGY_OP).fn

    def crashing(**call: Any) -> None:
        if call["x"].shape[0] > CRASH_ABOVE_ROWS:
            raise RuntimeError("illegal memory access")
        correct(**call)

    kernels.add(Kernel(BUGGY_OP, crashing))


def fused_moe_reading_expert_map_as_int64(kernels: KernelSet) -> None:
    """fused_moe that reads an int32 expert_map's buffer as int64 entries, the way a
    kernel that takes every index tensor's width from one of them would: half as many
    entries, each two ids run together, so no pick lands on this rank's experts. Only
    the expert-parallel path passes an expert_map; without one the kernel is right."""
    correct = kernels.get("fused_moe").fn

    def misread(**call: Any) -> None:
        expert_map = call["expert_map"]
        if expert_map is not None and expert_map.dtype == torch.int32 and expert_map.numel() % 2 == 0:
            wide = expert_map.contiguous().view(torch.int64)
            local = call["w13"].shape[0]
            seen = torch.full_like(expert_map, -1)
            seen[: wide.numel()] = torch.where((wide >= 0) & (wide < local), wide, -1).to(torch.int32)
            call = {**call, "expert_map": seen}
        correct(**call)

    kernels.add(Kernel("fused_moe", misread))


def lora_delta_off_by_a_tenth(kernels: KernelSet) -> None:
    """lora_linear adding its rows' adapter deltas ten percent too large: rows of the
    base model (slot -1), which get no delta, stay right."""
    correct = kernels.get("lora_linear").fn

    def buggy(**call: Any) -> None:
        correct(**call)
        call["out"].add_(call["out"] - call["y"], alpha=0.1)

    kernels.add(Kernel("lora_linear", buggy))


def refuse_fp8_cache(signature: CallSignature) -> str | None:
    """The support rule of a cache writer that stores model-dtype caches only."""
    cache = signature.dtype("key_cache" if signature.op == "reshape_and_cache" else "kv_cache")
    if cache is not None and cache.itemsize == 1:
        return "fp8 caches are not implemented by this backend"
    return None


def cache_writers_without_fp8(kernels: KernelSet) -> None:
    """Make both cache writers refuse fp8 caches."""
    for op in CACHE_WRITERS:
        kernels.add(dataclasses.replace(kernels.get(op), supports=refuse_fp8_cache))


@hookimpl
def accord_backends() -> list[Backend]:
    """The plugin hook: every test backend."""
    return [
        ReferenceVariant(BUGGY_BACKEND, silu_and_mul_off_by_a_tenth),
        ReferenceVariant(NO_FP8_CACHE_BACKEND, cache_writers_without_fp8),
        ReferenceVariant(CRASHING_BACKEND, silu_and_mul_crashing_on_big_batches),
        ReferenceVariant(EP_INDEX_BACKEND, fused_moe_reading_expert_map_as_int64),
        ReferenceVariant(LORA_BUGGY_BACKEND, lora_delta_off_by_a_tenth),
    ]
