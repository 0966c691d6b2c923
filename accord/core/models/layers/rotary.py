"""Rotary position embedding: the cos|sin angle table each scaling scheme defines, and
the layer that applies it through `ops.rotary_embedding`."""

from __future__ import annotations

import math

import torch

from ....op_contracts import OpDispatcher
from ...model_loader.model_config import RopeConfig


def inverse_frequencies(rope: RopeConfig) -> torch.Tensor:
    """Per-pair inverse frequencies [R/2] in fp32, scaled as `rope.rope_type` says
    (the formulas of Hugging Face's modeling_rope_utils)."""
    dim = rope.rotary_dim
    exponents = torch.arange(0, dim, 2, dtype=torch.int64).float() / dim
    base_freq = 1.0 / (rope.theta**exponents)
    if rope.rope_type == "linear":
        return base_freq / rope.factor
    if rope.rope_type == "llama3":
        return _llama3(base_freq, rope)
    if rope.rope_type == "yarn":
        return _yarn(rope)
    return base_freq


def attention_factor(rope: RopeConfig) -> float:
    """The factor yarn multiplies cos and sin by (1 for every other scheme)."""
    if rope.rope_type != "yarn":
        return 1.0
    if rope.attention_factor is not None:
        return rope.attention_factor
    if rope.mscale and rope.mscale_all_dim:
        return yarn_mscale(rope.factor, rope.mscale) / yarn_mscale(rope.factor, rope.mscale_all_dim)
    return yarn_mscale(rope.factor)


def yarn_mscale(scale: float, mscale: float = 1.0) -> float:
    """Yarn's magnitude correction for a context extended `scale` times."""
    return 1.0 if scale <= 1 else 0.1 * mscale * math.log(scale) + 1.0


def cos_sin_cache(rope: RopeConfig, max_positions: int) -> torch.Tensor:
    """The contract's fp32 [P, R] table: cos of each position's angles, then their sin."""
    positions = torch.arange(max_positions, dtype=torch.int64).float()
    angles = positions[:, None] * inverse_frequencies(rope)[None, :]
    factor = attention_factor(rope)
    return torch.cat([angles.cos() * factor, angles.sin() * factor], dim=-1).contiguous()


def _llama3(base_freq: torch.Tensor, rope: RopeConfig) -> torch.Tensor:
    old_context = rope.original_max_position_embeddings
    low_wavelen, high_wavelen = old_context / rope.low_freq_factor, old_context / rope.high_freq_factor
    wavelen = 2 * math.pi / base_freq
    scaled = torch.where(wavelen > low_wavelen, base_freq / rope.factor, base_freq)
    smooth = (old_context / wavelen - rope.low_freq_factor) / (rope.high_freq_factor - rope.low_freq_factor)
    smoothed = (1 - smooth) * scaled / rope.factor + smooth * scaled
    medium = ~(wavelen < high_wavelen) * ~(wavelen > low_wavelen)
    return torch.where(medium, smoothed, scaled)


def _yarn(rope: RopeConfig) -> torch.Tensor:
    dim, base = rope.rotary_dim, rope.theta

    def correction_dim(rotations: float) -> float:
        return (dim * math.log(rope.original_max_position_embeddings / (rotations * 2 * math.pi))) / (2 * math.log(base))

    low, high = correction_dim(rope.beta_fast), correction_dim(rope.beta_slow)
    if rope.truncate:
        low, high = math.floor(low), math.ceil(high)
    low, high = max(low, 0), min(high, dim - 1)
    if low == high:
        high += 0.001  # the ramp would divide by zero
    ramp = ((torch.arange(dim // 2, dtype=torch.float32) - low) / (high - low)).clamp(0, 1)
    pos_freqs = base ** (torch.arange(0, dim, 2).float() / dim)
    extrapolation, interpolation = 1.0 / pos_freqs, 1.0 / (rope.factor * pos_freqs)
    keep_extrapolation = 1 - ramp
    return interpolation * (1 - keep_extrapolation) + extrapolation * keep_extrapolation


class RotaryEmbedding:
    """Rotates query and key heads by their tokens' positions (one table per model,
    shared by its layers)."""

    def __init__(self, ops: OpDispatcher, rope: RopeConfig, max_positions: int, device: torch.device) -> None:
        self.ops = ops
        self.is_neox = rope.is_neox
        self.cos_sin_cache = cos_sin_cache(rope, max_positions).to(device)

    def __call__(
        self, positions: torch.Tensor, query: torch.Tensor, key: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """(query, key) [T, heads, D] rotated in their first R dims."""
        return self.ops.rotary_embedding(positions, query, key, self.cos_sin_cache, is_neox=self.is_neox)
