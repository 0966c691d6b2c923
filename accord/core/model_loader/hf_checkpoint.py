"""Reading a Hugging Face model directory: config files and safetensors checkpoints.

Only safetensors are read. Pickle checkpoints (`*.bin`, `*.pt`, `*.pth`) are refused
without being opened, because unpickling runs arbitrary code.
"""

from __future__ import annotations

import json
from collections.abc import Collection
from pathlib import Path
from typing import Any

import torch
from safetensors import safe_open

SINGLE_FILE = "model.safetensors"
SHARD_INDEX = "model.safetensors.index.json"
PICKLE_SUFFIXES = (".bin", ".pt", ".pth", ".ckpt")


class CheckpointError(ValueError):
    """A model directory or checkpoint that cannot be loaded; says what and where."""


def read_json(model_dir: Path, name: str, required: bool = True) -> dict[str, Any]:
    """One JSON file of the model directory as a dict ({} when optional and absent)."""
    path = model_dir / name
    if not path.is_file():
        if required:
            raise CheckpointError(f"{model_dir}: {name} is missing; is this a Hugging Face model directory?")
        return {}
    with path.open() as handle:
        return json.load(handle)


class TrackedTensorNames:
    """The tensor names of one checkpoint and which of them were read: the bookkeeping
    every checkpoint reader shares, so the loader can report tensors the graph never
    asked for."""

    def __init__(self, model_dir: str | Path, names: Collection[str]) -> None:
        self.model_dir = Path(model_dir)
        self._names = names
        self._read: set[str] = set()

    def __contains__(self, name: str) -> bool:
        return name in self._names

    def names(self) -> list[str]:
        """Every tensor name in the checkpoint, sorted."""
        return sorted(self._names)

    def unread(self) -> list[str]:
        """Names nobody has read yet, sorted."""
        return sorted(set(self._names) - self._read)

    def _mark_read(self, name: str) -> None:
        """Record that `name` was read; a name the checkpoint lacks is a CheckpointError."""
        if name not in self._names:
            raise CheckpointError(f"{self.model_dir}: tensor {name!r} is missing from the checkpoint")
        self._read.add(name)


class SafetensorsCheckpoint(TrackedTensorNames):
    """The tensors of a model directory, from model.safetensors or the shards its
    index lists, read one at a time, used names tracked."""

    def __init__(self, model_dir: str | Path) -> None:
        self.model_dir = Path(model_dir)
        self._file_of = self._locate_tensors()
        super().__init__(model_dir, self._file_of.keys())
        self._handles: dict[str, Any] = {}

    def _locate_tensors(self) -> dict[str, Path]:
        index, single = self.model_dir / SHARD_INDEX, self.model_dir / SINGLE_FILE
        if index.is_file():
            weight_map = read_json(self.model_dir, SHARD_INDEX)["weight_map"]
            files = {name: self.model_dir / shard for name, shard in weight_map.items()}
            for path in sorted(set(files.values())):
                if not path.is_file():
                    raise CheckpointError(f"{self.model_dir}: shard {path.name} listed in {SHARD_INDEX} is missing")
            return files
        if single.is_file():
            with safe_open(single, framework="pt") as handle:
                return {name: single for name in handle.keys()}
        pickles = sorted(p.name for p in self.model_dir.iterdir() if p.suffix in PICKLE_SUFFIXES)
        if pickles:
            raise CheckpointError(
                f"{self.model_dir}: only pickle checkpoints found ({', '.join(pickles)}); they are refused, never "
                "unpickled, because loading them runs arbitrary code. Convert them to safetensors first."
            )
        raise CheckpointError(f"{self.model_dir}: no {SINGLE_FILE} or {SHARD_INDEX} found")

    def shape(self, name: str) -> tuple[int, ...]:
        """A tensor's stored shape, without reading its data."""
        return tuple(self._handle(name).get_slice(name).get_shape())

    def read(self, name: str) -> torch.Tensor:
        """A tensor as stored (dtype unchanged), marked as used."""
        self._mark_read(name)
        return self._handle(name).get_tensor(name)

    def read_slice(self, name: str, dim: int, start: int, stop: int) -> torch.Tensor:
        """Rows [start, stop) of a tensor along `dim`, read from disk without the rest
        (a tensor-parallel rank's shard), marked as used."""
        self._mark_read(name)
        index = (slice(None),) * dim + (slice(start, stop),)
        return self._handle(name).get_slice(name)[index]

    def _handle(self, name: str) -> Any:
        path = self._file_of[name]
        key = str(path)
        if key not in self._handles:
            self._handles[key] = safe_open(path, framework="pt")
        return self._handles[key]
