"""Poisoned, guarded buffers: conformance's allocator for outputs and mutated tensors.

Every buffer a kernel may write is the middle view of a larger allocation filled with
poison (NaN for floats, a sentinel for integers). Slots the kernel never wrote still
hold poison afterwards, and a write past either end lands in a guard region, which must
still hold poison when the kernel returns.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

#: Elements of poison on each side of every buffer.
GUARD_ELEMENTS = 64
#: The integer poison: negative (no index output is) and an odd byte pattern, so a
#: kernel writing 32-bit values into a 64-bit buffer cannot leave it intact.
INT_POISON = -0x2A2A2A2B


def poison_value(dtype: torch.dtype) -> torch.Tensor:
    """One element of poison at `dtype` (NaN for floating dtypes, fp8 included)."""
    if dtype.is_floating_point:
        return torch.tensor(float("nan")).to(dtype)
    return torch.tensor(INT_POISON, dtype=dtype)


def _element_bytes(tensor: torch.Tensor) -> torch.Tensor:
    """The tensor's elements as rows of raw bytes: [numel, itemsize] uint8."""
    return tensor.reshape(-1).view(torch.uint8).view(-1, tensor.element_size())


def count_poisoned(tensor: torch.Tensor) -> int:
    """How many elements of `tensor` still hold poison bit for bit (never written)."""
    poison = _element_bytes(poison_value(tensor.dtype).reshape(1))
    return int((_element_bytes(tensor) == poison).all(dim=1).sum())


@dataclass(frozen=True)
class GuardedBuffer:
    """One allocation: the view handed to the kernel inside its poisoned storage."""

    name: str
    storage: torch.Tensor
    view: torch.Tensor

    def guard_breaches(self) -> int:
        """Elements of the guard regions that no longer hold poison."""
        before, after = self.storage[:GUARD_ELEMENTS], self.storage[-GUARD_ELEMENTS:]
        return (GUARD_ELEMENTS - count_poisoned(before)) + (GUARD_ELEMENTS - count_poisoned(after))


class PoisonAllocator:
    """The dispatcher's `allocator` in conformance: hands out poisoned middle views of
    guarded storage and remembers every buffer so the runner can inspect them."""

    def __init__(self, output_names: tuple[str, ...] = ()) -> None:
        # The dispatcher allocates outputs in contract order, so names follow that order.
        self._output_names = iter(output_names)
        self.buffers: list[GuardedBuffer] = []

    def __call__(self, shape: tuple[int, ...], dtype: torch.dtype, device: torch.device) -> torch.Tensor:
        name = next(self._output_names, f"output {len(self.buffers)}")
        return self._guarded(name, shape, dtype, device)

    def adopt(self, name: str, tensor: torch.Tensor) -> torch.Tensor:
        """A guarded copy of `tensor` (an in-place operand such as a KV cache), so
        writes past its ends are caught like an output's."""
        view = self._guarded(name, tuple(tensor.shape), tensor.dtype, tensor.device)
        view.copy_(tensor)
        return view

    def breaches(self) -> list[str]:
        """One line per buffer whose guard regions were written."""
        return [
            f"{buffer.name}: {count} guard elements overwritten (out-of-bounds write)"
            for buffer in self.buffers
            if (count := buffer.guard_breaches())
        ]

    def _guarded(self, name: str, shape: tuple[int, ...], dtype: torch.dtype, device: torch.device) -> torch.Tensor:
        numel = 1
        for size in shape:
            numel *= size
        storage = poison_value(dtype).to(device).repeat(numel + 2 * GUARD_ELEMENTS)
        view = storage[GUARD_ELEMENTS : GUARD_ELEMENTS + numel].view(shape)
        self.buffers.append(GuardedBuffer(name, storage, view))
        return view
