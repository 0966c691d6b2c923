"""DeepSeek-V4's rotary: interleaved (gpt-j) pairs on the *trailing* rotary dims of each
head, through ops.rotary_embedding, and its inverse for the attention output."""

from __future__ import annotations

import torch

from ....op_contracts import OpDispatcher
from ...model_loader.model_config import RopeConfig
from ..layers.rotary import cos_sin_cache


class TrailingRotary:
    """Rotates the last `rope.rotary_dim` dims of every head by the token's position."""

    def __init__(self, ops: OpDispatcher, rope: RopeConfig, max_positions: int, device: torch.device) -> None:
        self.ops = ops
        self.rotary_dim = rope.rotary_dim
        self.cos_sin_cache = cos_sin_cache(rope, max_positions).to(device)

    def __call__(self, positions: torch.Tensor, x: torch.Tensor, inverse: bool = False) -> torch.Tensor:
        """x [T, H, D] with its trailing rotary dims turned by +angle (or -angle)."""
        nope = x.shape[-1] - self.rotary_dim
        rope = x[..., nope:].contiguous()
        if inverse:
            rope = _flip_odd(rope)
        # The contract rotates query and key together; a one-head key rides along.
        rotated, _ = self.ops.rotary_embedding(
            positions, rope, rope[:, :1].contiguous(), self.cos_sin_cache, is_neox=False
        )
        if inverse:
            rotated = _flip_odd(rotated)
        return torch.cat([x[..., :nope], rotated], dim=-1)


def _flip_odd(x: torch.Tensor) -> torch.Tensor:
    """x with the second element of every pair negated: conjugating a rotation by this
    reflection turns it into the rotation by the opposite angle (no second table)."""
    flipped = x.clone()
    flipped[..., 1::2] *= -1
    return flipped
