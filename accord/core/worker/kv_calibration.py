"""Start-up calibration of the fp8 KV cache scales (`--calculate-kv-scales`): one
forward over seeded random tokens on an unquantised scratch cache, observing each GQA
layer's keys and values; each layer's scale becomes amax(|k|) / fp8_max (and likewise
for v), so the largest value seen is stored at the format's largest, none saturates."""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from contextlib import contextmanager

import torch

from ..models.layers.attention import GQAAttention
from ..models.layers.kv_scales import KVScales

#: The calibration tokens' generator seed: every tensor-parallel rank draws the same batch.
CALIBRATION_SEED = 0
#: Most tokens the calibration forward runs (one sequence, capped by max_model_len).
CALIBRATION_TOKENS = 1024


class AmaxObserver:
    """The largest |k| and |v| one layer has computed since it was installed."""

    def __init__(self) -> None:
        self.k_amax = 0.0
        self.v_amax = 0.0

    def __call__(self, key: torch.Tensor, value: torch.Tensor) -> None:
        self.k_amax = max(self.k_amax, key.abs().max().float().item())
        self.v_amax = max(self.v_amax, value.abs().max().float().item())


def gqa_layers(layers: Sequence[object]) -> list[GQAAttention]:
    """The GQA attention of each decoder layer that has one (MLA layers keep scale 1.0)."""
    return [layer.attention for layer in layers if isinstance(getattr(layer, "attention", None), GQAAttention)]


def needs_calibration(layers: Sequence[GQAAttention]) -> bool:
    """Whether any layer lacks the checkpoint's scales (a checkpoint's scales are kept)."""
    return any(layer.kv_scales.source != "checkpoint" for layer in layers)


def calibration_tokens(vocab_size: int, max_model_len: int) -> torch.Tensor:
    """The calibration batch: one sequence of seeded random token ids [1, N] (int32)."""
    count = min(CALIBRATION_TOKENS, max_model_len)
    generator = torch.Generator().manual_seed(CALIBRATION_SEED)
    return torch.randint(0, vocab_size, (1, count), generator=generator, dtype=torch.int32)


@contextmanager
def calibrating(layers: Sequence[GQAAttention], fp8_max: float) -> Iterator[None]:
    """Observe `layers`' keys and values within the block; on leaving it normally, each
    layer without checkpoint scales takes amax / fp8_max as its scales."""
    observers = {id(layer): AmaxObserver() for layer in layers}
    for layer in layers:
        layer.kv_observer = observers[id(layer)]
    try:
        yield
    finally:
        for layer in layers:
            layer.kv_observer = None
    for layer in layers:
        if layer.kv_scales.source != "checkpoint":
            seen = observers[id(layer)]
            layer.kv_scales = KVScales.from_amax(seen.k_amax, seen.v_amax, fp8_max)
