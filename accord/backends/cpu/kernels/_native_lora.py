"""The batched multi-LoRA kernel of lora_linear.c (one shrink and one expand over every
token, each with its own adapter slot), built and loaded by `_native`."""

from __future__ import annotations

import ctypes
from functools import cache

import torch

from .. import capability
from . import _native

_P, _L, _I = ctypes.c_void_p, ctypes.c_long, ctypes.c_int

#: The entry points of lora_linear.c.
SIGNATURES = (
    ("accord_lora_paths", _I, ()),
    ("accord_lora_linear", _I, (_P,) * 6 + (_L,) * 6 + (_I,) * 3),
)
LIBRARY = ("lora_linear.c", SIGNATURES)
#: The shrink's dot paths, as lora_linear.c numbers them.
PATHS = {"fp32": 0, "dpbf16": 1}
#: The dtypes the C kernel computes; others (fp16) keep the torch path.
DTYPES = (torch.float32, torch.bfloat16)
#: What a nonzero status of accord_lora_linear means.
ERRORS = {1: "a slot id outside [-1, S)", 2: "a dot path not built on this host", 3: "no memory for its scratch"}


@cache  # the kernel calls this per op: one lookup, not a hash of the signatures
def _library() -> _native.NativeLibrary | None:
    """The built library; None where it cannot be built."""
    return _native.load(*LIBRARY)


def available() -> bool:
    """Whether the library is built (or can be) on this host."""
    return _library() is not None


@cache
def compiled_paths() -> tuple[str, ...]:
    """The shrink's dot paths this host's build has (fp32 always, dpbf16 where the
    compiler targets AVX512-BF16); empty without a library."""
    library = _library()
    if library is None:
        return ()
    bits = library.accord_lora_paths()
    return tuple(name for name, code in PATHS.items() if bits >> code & 1)


def lora_linear(
    y: torch.Tensor, x: torch.Tensor, lora_a: torch.Tensor, lora_b: torch.Tensor, slot_ids: torch.Tensor,
    out: torch.Tensor, path: str | None = None,
) -> None:
    """out = y + each token's adapter delta (see lora_linear.c), all one dtype of DTYPES
    on the host; x needs a unit column stride, the rest contiguity. `path` is the
    shrink's dot (default: dpbf16 for bf16 where built and the CPU computes bf16
    natively, else fp32). ValueError for a slot id out of range or a path not built."""
    slots, rank, depth = lora_a.shape
    bf16 = x.dtype is torch.bfloat16
    if path is None:
        native = bf16 and capability.cpu_has_native_bf16() and "dpbf16" in compiled_paths()
        path = "dpbf16" if native else "fp32"
    status = _library().accord_lora_linear(  # type: ignore[union-attr]
        y.data_ptr(), x.data_ptr(), lora_a.data_ptr(), lora_b.data_ptr(), slot_ids.data_ptr(), out.data_ptr(),
        x.shape[0], depth, lora_b.shape[2], rank, slots, x.stride(0), bf16, PATHS[path], torch.get_num_threads(),
    )
    if status:
        raise ValueError(f"lora_linear.c refused the call: {ERRORS.get(status, status)}")
