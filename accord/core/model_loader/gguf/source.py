"""A GGUF file opened as a model source (config, generation config, tensors)."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from .checkpoint import GgufCheckpoint
from .config import hf_config
from .reader import open_gguf


@dataclass(frozen=True)
class GgufSource:
    """What load_model reads from a GGUF file: config.json and generation_config.json
    equivalents, and the tensors."""

    config: dict[str, Any]
    generation: dict[str, Any]
    checkpoint: GgufCheckpoint


def open_gguf_model(path: str | Path) -> GgufSource:
    """The model in the GGUF file at `path`, or GgufError naming what is unsupported."""
    file = open_gguf(path)
    config, generation = hf_config(file)
    checkpoint = GgufCheckpoint(file, config["num_attention_heads"], config["num_key_value_heads"])
    return GgufSource(config, generation, checkpoint)
