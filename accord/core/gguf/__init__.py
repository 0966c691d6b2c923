"""GGUF files (llama.cpp's format, what llama.cpp and Ollama users have on disk) as a
model source: metadata -> a Hugging Face config dict, tensors -> a checkpoint read by
Hugging Face name and dequantised at load, vocabulary -> accord's Tokenizer.

`load_model` and `load_tokenizer` dispatch here (`gguf.tokenizer`, imported on use:
it builds on core's Tokenizer) for a path ending in `.gguf`; from there on a GGUF
model is built by the same graphs as a Hugging Face directory.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from .checkpoint import GgufCheckpoint
from .config import ARCHITECTURES, SUPPORTED_TYPES, hf_config
from .reader import GgufError, is_gguf, open_gguf


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


__all__ = [
    "ARCHITECTURES",
    "SUPPORTED_TYPES",
    "GgufError",
    "GgufSource",
    "is_gguf",
    "open_gguf_model",
]
