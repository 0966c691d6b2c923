"""One group-quantised linear's stored tensors, read as far as a window of it needs (a
tensor-parallel shard: output rows or input channels), so a rank reads and converts its
own part of the linear, not the whole linear once per shard. Each format declares where
the rows and the input channels run in each tensor it stores (`StoredPart`); the window
is widened to the stored words and groups it touches, and the converted weight is cut
back to it (`StoredLinear.cut`)."""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from ....op_contracts import PER_CHANNEL
from ...quantization import GroupQuantWeight, column_split_problem
from ..hf_checkpoint import CheckpointError, SafetensorsCheckpoint
from .scheme import GroupQuantScheme

#: Units of a stored dim: one channel an entry, a 32-bit word of packed codes (32 //
#: bits channels), or a group of input channels (group_size of them).
CHANNEL, WORD, GROUP = "channel", "word", "group"


@dataclass(frozen=True)
class StoredPart:
    """One tensor a format stores per linear (`prefix.suffix`): the dim that runs along
    the output rows N and the one along the input channels K (None: no dim does), each
    with its unit (CHANNEL, WORD or GROUP)."""

    suffix: str
    n_dim: int | None
    k_dim: int | None
    n_unit: str = CHANNEL
    k_unit: str = CHANNEL


@dataclass(frozen=True)
class Window:
    """Output rows (dim 0) or input channels (dim 1) [start, stop) of a linear whose
    logical shape is [rows, depth]."""

    dim: int
    start: int
    stop: int
    rows: int
    depth: int

    def __post_init__(self) -> None:
        if self.dim not in (0, 1):
            raise ValueError(f"a linear's window runs along dim 0 (rows) or 1 (input channels), not {self.dim}")

    @property
    def extent(self) -> int:
        """The linear's length along the window's dim."""
        return self.rows if self.dim == 0 else self.depth

    @property
    def shape(self) -> tuple[int, int]:
        """The window's logical [N, K]."""
        size = self.stop - self.start
        return (size, self.depth) if self.dim == 0 else (self.rows, size)

    def widened(self, step: int) -> Window:
        """The smallest window on multiples of `step` (or the end) that holds this one."""
        stop = min(self.extent, -(-self.stop // step) * step)
        return Window(self.dim, self.start // step * step, stop, self.rows, self.depth)


class StoredLinear:
    """Linear `prefix` of `checkpoint`, stored as `parts`, read for `asked`: `read` gives
    each part's entries along the window's dim that cover `window` (`asked` widened to
    the stored words and groups), the other dim whole; `g_idx` is act-order's groups
    over `window` (None: channel k is in group k // group_size, where the checkpoint
    stores none or stores exactly that); `cut` narrows a weight read over `window` to
    `asked`. A window of input channels that no group_quant_linear weight can hold (off
    a word of codes, or off a group without act-order) is refused, naming the linear."""

    def __init__(
        self, checkpoint: SafetensorsCheckpoint, prefix: str, parts: tuple[StoredPart, ...], g_idx_suffix: str | None,
        scheme: GroupQuantScheme, asked: Window,
    ) -> None:
        self.checkpoint, self.prefix, self.asked = checkpoint, prefix, asked
        if not 0 <= asked.start <= asked.stop <= asked.extent:
            raise CheckpointError(
                f"{checkpoint.model_dir}: {prefix}.weight has {asked.extent} entries along dim {asked.dim}; "
                f"[{asked.start}:{asked.stop}] is outside it"
            )
        groups = _act_order_groups(checkpoint, f"{prefix}.{g_idx_suffix}", scheme.group_size) if g_idx_suffix else None
        if asked.dim == 1:
            problem = column_split_problem(
                asked.start, asked.stop, asked.depth, scheme.bits, scheme.group_size, groups is not None
            )
            if problem is not None:
                raise CheckpointError(
                    f"{checkpoint.model_dir}: {scheme.method} tensor {prefix}.weight cannot be split for tensor "
                    f"parallel: {problem}; choose a tensor-parallel size that splits its input channels on those edges"
                )
        units = {
            GROUP: None if groups is not None or scheme.group_size == PER_CHANNEL else scheme.group_size,
            WORD: 32 // scheme.bits, CHANNEL: 1,
        }
        # Each stored part's dim and unit along the window's dim (a unit of None: read whole).
        self._along = {
            part.suffix: (part.n_dim, units[part.n_unit]) if asked.dim == 0 else (part.k_dim, units[part.k_unit])
            for part in parts if f"{prefix}.{part.suffix}" in checkpoint
        }
        steps = [unit for dim, unit in self._along.values() if dim is not None and unit is not None]
        self.window = asked.widened(math.lcm(1, *steps))
        self.g_idx = groups if groups is None or asked.dim == 0 else groups[self.window.start : self.window.stop]

    @property
    def shape(self) -> tuple[int, int]:
        """The logical [N, K] of the window read."""
        return self.window.shape

    def __contains__(self, suffix: str) -> bool:
        return suffix in self._along

    def read(self, suffix: str) -> torch.Tensor:
        """Stored part `suffix`'s entries covering the window (checked against the count
        the linear's shape implies along the window's dim), contiguous: a format whose
        tensors already are group_quant_linear's hands them on as read."""
        name = f"{self.prefix}.{suffix}"
        dim, unit = self._along[suffix]
        if dim is None or unit is None:
            return self.checkpoint.read(name)
        stored, implied = self.checkpoint.shape(name)[dim], -(-self.window.extent // unit)
        if stored != implied:
            raise CheckpointError(
                f"{self.checkpoint.model_dir}: {name} has {stored} entries along dim {dim}, the layout implies {implied}"
            )
        return self.checkpoint.read_slice(name, dim, self.window.start // unit, -(-self.window.stop // unit)).contiguous()

    def skip(self, suffix: str) -> None:
        """Mark stored part `suffix` read though accord does not use it (so the loader does
        not report it as unexpected), without checking its layout."""
        self.checkpoint.read(f"{self.prefix}.{suffix}")

    def cut(self, weight: GroupQuantWeight) -> GroupQuantWeight:
        """`weight`, read over `window`, narrowed to the window asked for."""
        if self.window == self.asked:
            return weight
        start, stop = self.asked.start - self.window.start, self.asked.stop - self.window.start
        return weight.rows(start, stop) if self.asked.dim == 0 else weight.columns(start, stop)


def _act_order_groups(checkpoint: SafetensorsCheckpoint, name: str, group_size: int) -> torch.Tensor | None:
    """Stored g_idx `name` as int32, or None where there is none or it is k // group_size
    (all 0 per channel): GPTQ without act-order stores one anyway."""
    if name not in checkpoint:
        return None
    g_idx = checkpoint.read(name).to(torch.int32)
    sequential = torch.zeros_like(g_idx) if group_size == PER_CHANNEL else torch.arange(g_idx.shape[0]) // group_size
    return None if torch.equal(g_idx.long(), sequential.long()) else g_idx
