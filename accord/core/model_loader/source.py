"""Where a model comes from: a Hugging Face directory or a GGUF file, chosen once, by
name, in `model_source`. Everything that reads a model (its config, its tensors, its
tokenizer) asks the source, so no other module tells the two kinds apart."""

from __future__ import annotations

from dataclasses import dataclass
from functools import cached_property
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

from .gguf import is_gguf
from .hf_checkpoint import CheckpointError, SafetensorsCheckpoint, read_json
from .tokenizer import Tokenizer, load_hf_tokenizer

if TYPE_CHECKING:
    from .gguf.checkpoint import GgufCheckpoint
    from .gguf.source import GgufSource

#: A model's config.json and generation_config.json (or their equivalents), as dicts.
ConfigPair = tuple[dict[str, Any], dict[str, Any]]


class ModelSource(Protocol):
    """A model on disk: its configs, its tensors (read by Hugging Face name) and its
    tokenizer."""

    path: Path

    def configs(self) -> ConfigPair:
        """config.json and generation_config.json ({} when absent), or their equivalents."""
        ...

    def checkpoint(self) -> SafetensorsCheckpoint | GgufCheckpoint:
        """The tensors, read one at a time by Hugging Face name."""
        ...

    def tokenizer(self) -> Tokenizer:
        """The model's tokenizer."""
        ...


@dataclass(frozen=True)
class HfDirectory:
    """A Hugging Face model directory: config.json, safetensors, tokenizer.json."""

    path: Path

    def configs(self) -> ConfigPair:
        """config.json (required) and generation_config.json (or {})."""
        if not self.path.is_dir():
            raise CheckpointError(f"{self.path}: not a directory")
        return read_json(self.path, "config.json"), read_json(self.path, "generation_config.json", required=False)

    def checkpoint(self) -> SafetensorsCheckpoint:
        """The directory's safetensors (pickles are refused)."""
        return SafetensorsCheckpoint(self.path)

    def tokenizer(self) -> Tokenizer:
        """tokenizer.json with the special tokens and chat template beside it."""
        return load_hf_tokenizer(self.path)


@dataclass
class GgufFile:
    """A GGUF file (llama.cpp's format): metadata, tensors and vocabulary in one file.
    The `gguf` package is imported only when a GGUF file is read."""

    path: Path

    @cached_property
    def _opened(self) -> GgufSource:
        from .gguf.source import open_gguf_model

        return open_gguf_model(self.path)

    def configs(self) -> ConfigPair:
        """The metadata as config.json and generation_config.json would hold it."""
        return self._opened.config, self._opened.generation

    def checkpoint(self) -> GgufCheckpoint:
        """The tensors by Hugging Face name, dequantised as read."""
        return self._opened.checkpoint

    def tokenizer(self) -> Tokenizer:
        """The vocabulary built as a byte-level BPE tokenizer."""
        from .gguf.tokenizer import load_gguf_tokenizer

        return load_gguf_tokenizer(self.path)


def model_source(model: str | Path) -> HfDirectory | GgufFile:
    """The source `model` names: a GGUF file by its suffix (as vLLM and llama.cpp tell
    them apart), else a Hugging Face directory."""
    return GgufFile(Path(model)) if is_gguf(model) else HfDirectory(Path(model))


def load_tokenizer(model: str | Path) -> Tokenizer:
    """The tokenizer of a Hugging Face model directory (tokenizer.json is required) or
    of a GGUF file."""
    return model_source(model).tokenizer()
