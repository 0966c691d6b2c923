"""The op contracts a worker calls for a model: its graph's (the family's answer, from
config.json alone), the fp8 linears when weights are quantised at load, and the
sampler's. `--backend auto` asks a backend for these and no others."""

from __future__ import annotations

from pathlib import Path

from ..model_loader.load import read_model_config
from ..models.contract_ops import FP8_LINEAR
from ..models.registry import family

#: What the sampler calls every step.
SAMPLER_OPS = frozenset({"sample"})


def worker_contract_ops(model: str | Path, quantization: str | None = None) -> frozenset[str]:
    """The op contracts a worker serving `model` (a Hugging Face directory or a GGUF
    file) with `quantization` calls."""
    config = read_model_config(model)
    ops = family(config.architecture).contract_ops(config) | SAMPLER_OPS
    return ops | FP8_LINEAR if quantization == "fp8" else ops
