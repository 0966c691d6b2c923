"""The checkpoint view the weight loader reads a group-quantised checkpoint through:
every tensor as the safetensors hold it, plus each quantised linear under its Hugging
Face name (`prefix.weight`, shape [N, K]) handed out packed by `read_packed`, converted
from the checkpoint's format to group_quant_linear's layout (formats: one module each).
A tensor-parallel shard reads and converts only its own part of the stored tensors
(stored.py)."""

from __future__ import annotations

from types import ModuleType

import torch

from ....op_contracts import group_count, packed_words
from ...quantization import GroupQuantWeight
from ..hf_checkpoint import CheckpointError, SafetensorsCheckpoint
from . import awq, compressed_tensors, gptq
from .scheme import AWQ, COMPRESSED_TENSORS, GPTQ, GroupQuantScheme
from .stored import StoredLinear, Window

#: Each method's reader module: MARKER (the tensor suffix that marks a packed linear),
#: PARTS (where rows and input channels run in each stored tensor), G_IDX (act-order's
#: g_idx suffix, None: the format has none), shape(checkpoint, prefix, scheme) -> (N, K)
#: and read(StoredLinear, scheme) -> GroupQuantWeight (the StoredLinear's window).
READERS: dict[str, ModuleType] = {COMPRESSED_TENSORS: compressed_tensors, AWQ: awq, GPTQ: gptq}


def layout_problem(weight: GroupQuantWeight, shape: tuple[int, ...]) -> str | None:
    """What is wrong with a weight read from a checkpoint, against its logical [N, K]
    (None: nothing). The kernels index scales, zeros and g_idx by these shapes, and the
    dispatcher checks a signature's shapes once, so every layer is checked here."""
    rows, depth = shape
    groups = weight.scales.shape[1]
    expected = {
        "qweight": (rows, packed_words(depth, weight.bits)),
        "scales": (rows, groups if weight.g_idx is not None else group_count(depth, weight.group_size)),
    }
    if weight.zeros is not None:
        expected["zeros"] = (rows, groups)
    if weight.g_idx is not None:
        expected["g_idx"] = (depth,)
    for part, want in expected.items():
        got = tuple(getattr(weight, part).shape)
        if got != want:
            return f"{part} has shape {got}, the layout implies {want}"
    g_idx = weight.g_idx
    if g_idx is not None and depth and (int(g_idx.min()) < 0 or int(g_idx.max()) >= groups):
        return f"g_idx names groups outside [0, {groups})"
    return None


class GroupQuantCheckpoint:
    """`checkpoint` with its quantised linears readable packed (`read_packed`); reading
    one any other way is refused (accord keeps them packed)."""

    def __init__(self, checkpoint: SafetensorsCheckpoint, scheme: GroupQuantScheme) -> None:
        self.checkpoint = checkpoint
        self.scheme = scheme
        self.model_dir = checkpoint.model_dir
        self._reader = READERS[scheme.method]
        suffix = f".{self._reader.MARKER}"
        self._packed = {name[: -len(suffix)] for name in checkpoint.names() if name.endswith(suffix)}

    def _prefix(self, name: str) -> str | None:
        """The linear's prefix where `name` is a packed linear's weight, else None."""
        prefix = name.removesuffix(".weight")
        return prefix if prefix != name and prefix in self._packed else None

    def __contains__(self, name: str) -> bool:
        return self._prefix(name) is not None or name in self.checkpoint

    def names(self) -> list[str]:
        """Every stored tensor name, sorted."""
        return self.checkpoint.names()

    def unread(self) -> list[str]:
        """Stored names nobody has read yet (a packed linear's parts count as read)."""
        return self.checkpoint.unread()

    def shape(self, name: str) -> tuple[int, ...]:
        """A tensor's shape; a packed linear's is its logical [N, K]."""
        prefix = self._prefix(name)
        return self.checkpoint.shape(name) if prefix is None else self._reader.shape(self.checkpoint, prefix, self.scheme)

    def read(self, name: str) -> torch.Tensor:
        """A stored tensor; a packed linear's weight is refused."""
        self._refuse_dense(name)
        return self.checkpoint.read(name)

    def read_slice(self, name: str, dim: int, start: int, stop: int) -> torch.Tensor:
        """Rows [start, stop) of a stored tensor along `dim`; a packed linear's is refused."""
        self._refuse_dense(name)
        return self.checkpoint.read_slice(name, dim, start, stop)

    def read_packed(self, name: str, dim: int, start: int, stop: int) -> GroupQuantWeight | None:
        """Output rows (dim 0) or input channels (dim 1) [start, stop) of linear `name`,
        packed, read from the stored slices that cover them; None where the checkpoint
        stores it unquantised. CheckpointError for a slice outside the linear, or input
        channels that split a word of codes or (without act-order) a group."""
        prefix = self._prefix(name)
        if prefix is None:
            return None
        reader = self._reader
        stored = StoredLinear(
            self.checkpoint, prefix, reader.PARTS, reader.G_IDX, self.scheme, Window(dim, start, stop, *self.shape(name))
        )
        weight = reader.read(stored, self.scheme)
        problem = layout_problem(weight, stored.shape)
        if problem is not None:
            raise CheckpointError(f"{self.model_dir}: {self.scheme.method} tensors of {prefix}: {problem}")
        return stored.cut(weight)

    def _refuse_dense(self, name: str) -> None:
        if self._prefix(name) is not None:
            raise CheckpointError(
                f"{self.model_dir}: {name} is stored {self.scheme.method}-quantised; accord reads it only as a "
                "linear layer's packed weight (group_quant_linear), not as a dense tensor"
            )
