"""npu_rms_norm, npu_add_rms_norm, npu_rotary_mul, npu_swiglu and npu_clipped_swiglu as torch-npu documents
them: dtype sets, ranks and layouts checked first, then the formula in fp32, rounded
once to the input's dtype."""

from __future__ import annotations

import torch

from ._checks import FLOATS, contiguous, dtype_in, rank_in, require, same_dtype


def _rms(x: torch.Tensor, gamma: torch.Tensor, epsilon: float) -> tuple[torch.Tensor, torch.Tensor]:
    wide = x.float()
    rstd = torch.rsqrt(wide.pow(2).mean(dim=-1, keepdim=True) + epsilon)
    return (wide * rstd * gamma.float()).to(x.dtype), rstd


def npu_rms_norm(self: torch.Tensor, gamma: torch.Tensor, epsilon: float = 1e-6) -> tuple[torch.Tensor, torch.Tensor]:
    """(y, rstd): RMS norm over the last axis; self 2-8-D fp16/bf16/fp32, gamma of
    self's dtype over self's trailing axes."""
    op = "npu_rms_norm"
    dtype_in(op, "self", self, FLOATS)
    rank_in(op, "self", self, tuple(range(2, 9)))
    same_dtype(op, "gamma", gamma, "self", self)
    require(tuple(gamma.shape) == tuple(self.shape[-gamma.dim():]), op, "gamma", "self's trailing shape", tuple(gamma.shape))
    return _rms(self, gamma, epsilon)


def npu_add_rms_norm(
    x1: torch.Tensor, x2: torch.Tensor, gamma: torch.Tensor, epsilon: float = 1e-6
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(y, rstd, x): x = x1 + x2 stored in x1's dtype, y = rms_norm(x) * gamma; x1, x2
    and gamma share one dtype of fp16/bf16/fp32 and x1 and x2 one shape."""
    op = "npu_add_rms_norm"
    dtype_in(op, "x1", x1, FLOATS)
    same_dtype(op, "x2", x2, "x1", x1)
    same_dtype(op, "gamma", gamma, "x1", x1)
    require(x1.shape == x2.shape, op, "x2", f"of x1's shape {tuple(x1.shape)}", tuple(x2.shape))
    summed = (x1.float() + x2.float()).to(x1.dtype)
    y, rstd = _rms(summed, gamma, epsilon)
    return y, rstd, summed


def _rotate(x: torch.Tensor, rotary_mode: str) -> torch.Tensor:
    if rotary_mode == "half":
        x1, x2 = torch.chunk(x, 2, dim=-1)
        return torch.cat((-x2, x1), dim=-1)
    return torch.stack((-x[..., 1::2], x[..., ::2]), dim=-1).flatten(-2)


def npu_rotary_mul(
    input: torch.Tensor, r1: torch.Tensor, r2: torch.Tensor, rotary_mode: str = "half", rotate: torch.Tensor | None = None
) -> torch.Tensor:
    """r1 * input + r2 * rotate_half(input) ('half') or its interleaved form. input is
    4-D (BNSD/BSND/SBND), D even and < 896, B and N < 1000; r1/r2 are 4-D of input's
    dtype, broadcast over input (interleave mode takes only the 1S1D-style broadcast
    with size-1 batch and head axes). The rotate-matrix form is not emulated."""
    op = "npu_rotary_mul"
    require(rotate is None, op, "rotate", "None (the rotate-matrix form is not emulated)", "a tensor")
    require(rotary_mode in ("half", "interleave"), op, "rotary_mode", "'half' or 'interleave'", rotary_mode)
    dtype_in(op, "input", input, FLOATS)
    rank_in(op, "input", input, (4,))
    for name, table in (("r1", r1), ("r2", r2)):
        same_dtype(op, name, table, "input", input)
        rank_in(op, name, table, (4,))
        require(table.shape[-1] == input.shape[-1], op, name, f"last axis D={input.shape[-1]}", tuple(table.shape))
        if rotary_mode == "interleave":
            require(table.shape[0] == 1 and table.shape[2] == 1, op, name, "1S1D-shaped in interleave mode", tuple(table.shape))
    head_dim = input.shape[-1]
    require(head_dim % 2 == 0 and head_dim < 896, op, "input", "D even and < 896", head_dim)
    require(input.shape[0] < 1000 and input.shape[2] < 1000, op, "input", "B and N < 1000", tuple(input.shape))
    contiguous(op, "input", input)
    wide = input.float()
    return (r1.float() * wide + r2.float() * _rotate(wide, rotary_mode)).to(input.dtype)


def npu_swiglu(input: torch.Tensor, dim: int = -1) -> torch.Tensor:
    """silu(A) * B for the halves A, B of input along `dim`; 1-8-D fp16/bf16/fp32."""
    op = "npu_swiglu"
    dtype_in(op, "input", input, FLOATS)
    rank_in(op, "input", input, tuple(range(1, 9)))
    require(input.shape[dim] % 2 == 0, op, "input", f"even along dim {dim}", tuple(input.shape))
    gate, up = torch.chunk(input.float(), 2, dim=dim)
    return (torch.nn.functional.silu(gate) * up).to(input.dtype)


def npu_clipped_swiglu(
    x: torch.Tensor,
    *,
    group_index: torch.Tensor | None = None,
    dim: int = -1,
    alpha: float = 1.702,
    limit: float = 7.0,
    bias: float = 1.0,
    interleaved: bool = True,
) -> torch.Tensor:
    """A * sigmoid(alpha * A) * (B + bias) with A = a.clamp(max=limit) and B =
    b.clamp(-limit, limit), (a, b) the even/odd (interleaved) or first/second halves of
    x along `dim`; x contiguous, at least 2-D, fp16/bf16/fp32, even along `dim`. The
    group_index form is not emulated."""
    op = "npu_clipped_swiglu"
    require(group_index is None, op, "group_index", "None (the grouped form is not emulated)", "a tensor")
    dtype_in(op, "x", x, FLOATS)
    rank_in(op, "x", x, tuple(range(2, 9)))
    contiguous(op, "x", x)
    require(x.shape[dim] % 2 == 0, op, "x", f"even along dim {dim}", tuple(x.shape))
    wide = x.float().movedim(dim, -1)
    a, b = (wide[..., ::2], wide[..., 1::2]) if interleaved else torch.chunk(wide, 2, dim=-1)
    a, b = a.clamp(max=limit), b.clamp(-limit, limit)
    return (a * torch.sigmoid(alpha * a) * (b + bias)).movedim(-1, dim).to(x.dtype)
