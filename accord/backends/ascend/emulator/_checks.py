"""How the emulator refuses a call the NPU operator would refuse: one error type that
names the operator, the argument and the documented restriction it broke."""

from __future__ import annotations

import torch


class NpuOperatorError(RuntimeError):
    """A call outside a torch-npu operator's documented contract (dtype, rank, layout or
    value range). torch-npu raises a RuntimeError from the operator for such a call;
    the emulator raises this subclass, with the restriction spelled out."""

    def __init__(self, op: str, arg: str, restriction: str, got: str) -> None:
        self.op, self.arg, self.restriction, self.got = op, arg, restriction, got
        super().__init__(f"{op}: {arg} must be {restriction}, got {got}")


def dtype_in(op: str, arg: str, tensor: torch.Tensor, allowed: tuple[torch.dtype, ...]) -> None:
    """Refuse `tensor` unless its dtype is one of `allowed`."""
    if tensor.dtype not in allowed:
        names = "/".join(str(d).replace("torch.", "") for d in allowed)
        raise NpuOperatorError(op, arg, names, str(tensor.dtype).replace("torch.", ""))


def same_dtype(op: str, arg: str, tensor: torch.Tensor, like: str, other: torch.Tensor) -> None:
    """Refuse `tensor` unless it has the dtype of argument `like`."""
    if tensor.dtype != other.dtype:
        raise NpuOperatorError(op, arg, f"{other.dtype} like {like}", str(tensor.dtype))


def rank_in(op: str, arg: str, tensor: torch.Tensor, ranks: tuple[int, ...]) -> None:
    """Refuse `tensor` unless its rank is one of `ranks`."""
    if tensor.dim() not in ranks:
        raise NpuOperatorError(op, arg, f"of rank {'/'.join(map(str, ranks))}", f"rank {tensor.dim()}")


def contiguous(op: str, arg: str, tensor: torch.Tensor) -> None:
    """Refuse a non-contiguous `tensor` (most fused operators take contiguous ND only)."""
    if not tensor.is_contiguous():
        raise NpuOperatorError(op, arg, "contiguous", f"strides {tensor.stride()}")


def require(condition: bool, op: str, arg: str, restriction: str, got: object) -> None:
    """Refuse the call unless `condition` holds."""
    if not condition:
        raise NpuOperatorError(op, arg, restriction, str(got))


FLOATS = (torch.float16, torch.bfloat16, torch.float32)
HALVES = (torch.float16, torch.bfloat16)
