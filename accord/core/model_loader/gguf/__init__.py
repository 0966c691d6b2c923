"""GGUF files (llama.cpp's format, what llama.cpp and Ollama users have on disk) as a
model source: metadata -> a Hugging Face config dict, tensors -> a checkpoint read by
Hugging Face name and dequantised at load, vocabulary -> accord's Tokenizer.

`load_model` and `load_tokenizer` dispatch here (`gguf.tokenizer`, imported on use:
it builds on core's Tokenizer) for a path ending in `.gguf`; from there on a GGUF
model is built by the same graphs as a Hugging Face directory.

Only `is_gguf` is defined here; the rest is imported on first use, so serving a Hugging
Face directory never imports the `gguf` package (about 0.16 s of start-up).
"""

from __future__ import annotations

import importlib
from pathlib import Path
from typing import Any

GGUF_SUFFIX = ".gguf"

#: Public names and the submodule that defines each, imported on first use.
_LAZY = {
    "ARCHITECTURES": ".config",
    "SUPPORTED_TYPES": ".config",
    "GgufError": ".reader",
    "GgufSource": ".source",
    "open_gguf_model": ".source",
    "packed_tables": ".source",
}


def is_gguf(model: str | Path) -> bool:
    """Whether `model` names a GGUF file (by its suffix, as vLLM and llama.cpp do)."""
    return str(model).lower().endswith(GGUF_SUFFIX)


def __getattr__(name: str) -> Any:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    return getattr(importlib.import_module(module, __name__), name)


__all__ = ["is_gguf", *_LAZY]
