"""Per-layer scales of a quantised (fp8) KV cache: the stored value times the scale is
the real one (vLLM's k_scale/v_scale semantics), read from the checkpoint or calibrated
at start-up (accord.core.worker.kv_calibration)."""

from __future__ import annotations

from dataclasses import dataclass

from ..weights import WeightLoader


@dataclass(frozen=True)
class KVScales:
    """One attention layer's key and value cache scales (1.0: values stored as they are)."""

    k_scale: float = 1.0
    v_scale: float = 1.0
    #: Where the scales came from: "default", "checkpoint" or "calibrated".
    source: str = "default"

    def __post_init__(self) -> None:
        for name in ("k_scale", "v_scale"):
            value = getattr(self, name)
            if not value > 0.0 or value == float("inf"):
                raise ValueError(f"KV cache {name} must be a positive finite number, got {value}")

    @classmethod
    def from_amax(cls, k_amax: float, v_amax: float, fp8_max: float) -> KVScales:
        """The scales that map the largest |k| and |v| seen onto the fp8 format's largest
        value (an all-zero input keeps 1.0)."""
        return cls(k_amax / fp8_max if k_amax > 0 else 1.0, v_amax / fp8_max if v_amax > 0 else 1.0, "calibrated")


def load_kv_scales(weights: WeightLoader, prefix: str) -> KVScales:
    """The scales an attention layer's checkpoint holds at `prefix` (`model.layers.N.self_attn`):
    `k_scale` and `v_scale` (vLLM's and compressed-tensors' kv_cache_scheme names), or the
    older single `kv_scale` for both; defaults when it holds none. Only per-tensor scales
    are supported: a per-head scale (compressed-tensors' attn_head strategy) is refused."""
    k_scale, v_scale = weights.scalar(f"{prefix}.k_scale"), weights.scalar(f"{prefix}.v_scale")
    if k_scale is None and v_scale is None:
        k_scale = v_scale = weights.scalar(f"{prefix}.kv_scale")
        if k_scale is None:
            return KVScales()
    if k_scale is None or v_scale is None:
        raise ValueError(
            f"{weights.checkpoint.model_dir}: {prefix} has only one of k_scale and v_scale; a KV cache scale "
            "checkpoint holds both"
        )
    return KVScales(k_scale, v_scale, "checkpoint")
