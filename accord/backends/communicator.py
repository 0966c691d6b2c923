"""Collectives over torch.distributed under dtype contracts.

Each communicator (gloo, nccl, rccl, hccl) declares, per collective, the dtypes it
carries natively and the adapters it applies to others: an upcast for reductions (fp8
summed in fp32, say) or a uint8 view for pure data movement (a gather moves bytes, so
an fp8 tensor travels as its bytes). An adapter is logged once and counted; a dtype with
neither is refused with ContractError before anything reaches the wire.

Expert parallel's all_to_all dispatch (core/distributed/expert_dispatch.py) relies on
this table: it sends fp8 (e4m3) activations with fp32 per-token scales, so all_to_all
must carry both; it asks `carries` first and falls back to the model dtype where fp8 is
not carried (a refused dtype would raise ContractError, never travel cast).
"""

from __future__ import annotations

import logging
from collections import Counter
from dataclasses import dataclass, field
from typing import Any, Mapping, Sequence

import torch
import torch.distributed as dist

from ..op_contracts import FP8_DTYPES, ContractError, dtype_name

logger = logging.getLogger("accord.contracts")

#: Collectives a communicator offers; the first two reduce, the others move data.
REDUCTIONS = ("all_reduce", "reduce_scatter")
DATA_MOVEMENT = ("all_gather", "all_to_all")
COLLECTIVES = REDUCTIONS + DATA_MOVEMENT


@dataclass(frozen=True)
class CollectiveAdapter:
    """How a dtype a communicator does not carry natively travels anyway: `upcast` to
    `to` and back (reductions), or `bytes` (a uint8 view; data movement only)."""

    kind: str
    to: torch.dtype = torch.uint8

    def describe(self, dtype: torch.dtype) -> str:
        """One line for logs and reports."""
        if self.kind == "bytes":
            return f"{dtype_name(dtype)} moved as a uint8 view"
        return f"{dtype_name(dtype)} upcast to {dtype_name(self.to)} and back"


@dataclass(frozen=True)
class CollectiveSupport:
    """A communicator's dtype contract: per collective, the dtypes it carries natively;
    per (collective, dtype), the declared adapter for one it does not."""

    name: str
    native: Mapping[str, frozenset[torch.dtype]]
    adapters: Mapping[tuple[str, torch.dtype], CollectiveAdapter] = field(default_factory=dict)

    def plan(self, collective: str, dtype: torch.dtype) -> CollectiveAdapter | None:
        """None when `dtype` travels natively, the adapter when one is declared; raises
        ContractError naming the collective, the dtype and what it carries otherwise."""
        if collective not in self.native:
            raise ContractError(
                f"collective.{collective}", "collective", f"one of {list(COLLECTIVES)}", collective, self.name
            )
        if dtype in self.native[collective]:
            return None
        adapter = self.adapters.get((collective, dtype))
        if adapter is None:
            carried = sorted(dtype_name(d) for d in self.native[collective])
            raise ContractError(
                f"collective.{collective}", "tensor", f"dtype in {carried}", dtype_name(dtype), self.name,
                hint="this communicator neither carries it nor declares an adapter for it",
            )
        return adapter

    def carries(self, collective: str, dtype: torch.dtype) -> bool:
        """Whether `collective` takes `dtype` natively or through a declared adapter."""
        return dtype in self.native.get(collective, frozenset()) or (collective, dtype) in self.adapters


def _support(name: str, carried: Sequence[torch.dtype], fp8_native_movement: bool) -> CollectiveSupport:
    """The table shared by torch's communicators: `carried` natively by every
    collective; fp8 reduced in fp32, and moved natively or as bytes."""
    native = {c: frozenset(carried) for c in REDUCTIONS}
    movement = frozenset(carried) | (frozenset(FP8_DTYPES) if fp8_native_movement else frozenset())
    native.update({c: movement for c in DATA_MOVEMENT})
    adapters = {(c, d): CollectiveAdapter("upcast", torch.float32) for c in REDUCTIONS for d in FP8_DTYPES}
    if not fp8_native_movement:
        adapters.update({(c, d): CollectiveAdapter("bytes") for c in DATA_MOVEMENT for d in FP8_DTYPES})
    return CollectiveSupport(name, native, adapters)


_COMMON = (
    torch.float32, torch.float64, torch.float16, torch.bfloat16,
    torch.int8, torch.uint8, torch.int32, torch.int64, torch.bool,
)
#: Measured on this repository's torch build (tests/distributed/test_communicator.py
#: probes gloo for real): gloo carries bf16 and fp16 in every collective, fp8 in none.
GLOO = _support("gloo", _COMMON, fp8_native_movement=False)
#: NCCL (and RCCL through torch's nccl) moves fp8 natively but refuses to reduce it.
NCCL = _support("nccl", _COMMON, fp8_native_movement=True)
RCCL = _support("rccl", _COMMON, fp8_native_movement=True)
#: HCCL's contract is the ascend backend's to declare (backends/ascend/communicator.py).
SUPPORT_BY_BACKEND = {s.name: s for s in (GLOO, NCCL, RCCL)}


class TorchCommunicator:
    """all_reduce / all_gather / reduce_scatter / all_to_all over one torch.distributed
    process group, each checked against `support` first. Results are new tensors; the
    sum is the reduction."""

    def __init__(self, group: Any, support: CollectiveSupport) -> None:
        self.group = group
        self.support = support
        self.world_size = dist.get_world_size(group)
        self.rank = dist.get_rank(group)
        #: "collective.dtype->adapter" -> times applied, as the dispatcher counts its own.
        self.adapter_counts: Counter[str] = Counter()
        self._logged: set[tuple[str, torch.dtype]] = set()

    @property
    def name(self) -> str:
        """The communicator's name (gloo, nccl, ...)."""
        return self.support.name

    def all_reduce(self, x: torch.Tensor) -> torch.Tensor:
        """The elementwise sum of `x` over the ranks."""
        adapter = self._plan("all_reduce", x)
        wire = self._to_wire(x, adapter)
        dist.all_reduce(wire, group=self.group)
        return self._from_wire(wire, x.dtype, adapter)

    def all_gather(self, x: torch.Tensor, dim: int = 0, sizes: Sequence[int] | None = None) -> torch.Tensor:
        """The ranks' `x` concatenated along `dim` in rank order. `sizes` gives each
        rank's extent along `dim` when they differ (a rank may contribute none)."""
        adapter = self._plan("all_gather", x)
        dim = dim % max(x.dim(), 1)
        moved = x.movedim(dim, 0).contiguous()
        extents = list(sizes) if sizes is not None else [moved.shape[0]] * self.world_size
        if len(extents) != self.world_size or extents[self.rank] != moved.shape[0]:
            raise ContractError(
                "collective.all_gather", "sizes", f"{self.world_size} extents with this rank's = {moved.shape[0]}",
                str(extents), self.name,
            )
        longest = max(extents)
        padded = torch.zeros((longest, *moved.shape[1:]), dtype=x.dtype, device=x.device)
        padded[: moved.shape[0]] = moved
        wire = self._to_wire(padded, adapter)
        out = torch.empty((self.world_size * wire.shape[0], *wire.shape[1:]), dtype=wire.dtype, device=wire.device)
        dist.all_gather_single(out, wire, group=self.group)
        gathered = self._from_wire(out, x.dtype, adapter).view(self.world_size, longest, *moved.shape[1:])
        parts = [gathered[r, : extents[r]] for r in range(self.world_size)]
        return torch.cat(parts).movedim(0, dim).contiguous()

    def reduce_scatter(self, x: torch.Tensor, dim: int = 0, sizes: Sequence[int] | None = None) -> torch.Tensor:
        """This rank's slice along `dim` of the sum of `x` over the ranks: equal slices,
        or `sizes[r]` rows for rank r when they differ (they must add up to x's extent;
        a rank may get none). Uneven slices travel padded to the longest."""
        adapter = self._plan("reduce_scatter", x)
        dim = dim % x.dim()
        moved = x.movedim(dim, 0)
        if sizes is None:
            if moved.shape[0] % self.world_size:
                raise ContractError(
                    "collective.reduce_scatter", "tensor", f"dim {dim} divisible by {self.world_size}",
                    str(tuple(x.shape)), self.name,
                )
            extents = [moved.shape[0] // self.world_size] * self.world_size
        else:
            extents = list(sizes)
            if len(extents) != self.world_size or sum(extents) != moved.shape[0]:
                raise ContractError(
                    "collective.reduce_scatter", "sizes", f"{self.world_size} extents adding up to {moved.shape[0]}",
                    str(extents), self.name,
                )
        longest = max(extents)
        if any(extent != longest for extent in extents):
            padded = moved.new_zeros((self.world_size, longest, *moved.shape[1:]))
            for r, piece in enumerate(moved.split(extents)):
                padded[r, : extents[r]] = piece
            moved = padded.flatten(0, 1)
        wire = self._to_wire(moved.contiguous(), adapter)
        out = torch.empty((longest, *wire.shape[1:]), dtype=wire.dtype, device=wire.device)
        dist.reduce_scatter_single(out, wire, group=self.group)
        mine = self._from_wire(out, x.dtype, adapter)[: extents[self.rank]]
        return mine.movedim(0, dim).contiguous()

    def all_to_all(
        self, x: torch.Tensor, output_split_sizes: Sequence[int], input_split_sizes: Sequence[int]
    ) -> torch.Tensor:
        """Rows of `x` [N, ...] sent in `input_split_sizes` chunks to ranks 0.., and the
        chunks received from each rank (`output_split_sizes`) concatenated in rank order."""
        adapter = self._plan("all_to_all", x)
        wire = self._to_wire(x.contiguous(), adapter)
        out = torch.empty((sum(output_split_sizes), *wire.shape[1:]), dtype=wire.dtype, device=wire.device)
        dist.all_to_all_single(
            out, wire, list(output_split_sizes), list(input_split_sizes), group=self.group
        )
        return self._from_wire(out, x.dtype, adapter)

    def carries(self, collective: str, dtype: torch.dtype) -> bool:
        """Whether `collective` takes `dtype`, natively or through a declared adapter (a
        caller choosing a wire format asks first; a refused dtype would raise)."""
        return self.support.carries(collective, dtype)

    def _plan(self, collective: str, x: torch.Tensor) -> CollectiveAdapter | None:
        adapter = self.support.plan(collective, x.dtype)
        if adapter is not None:
            self.adapter_counts[f"{collective}.{dtype_name(x.dtype)}->{adapter.kind}"] += 1
            if (collective, x.dtype) not in self._logged:
                self._logged.add((collective, x.dtype))
                logger.warning(
                    "collective.%s on communicator '%s': applying declared adapter: %s",
                    collective, self.name, adapter.describe(x.dtype),
                )
        return adapter

    @staticmethod
    def _to_wire(x: torch.Tensor, adapter: CollectiveAdapter | None) -> torch.Tensor:
        if adapter is None:
            return x.clone() if x.is_contiguous() else x.contiguous()
        if adapter.kind == "bytes":
            return x.contiguous().view(torch.uint8).clone()
        return x.to(adapter.to)

    @staticmethod
    def _from_wire(wire: torch.Tensor, dtype: torch.dtype, adapter: CollectiveAdapter | None) -> torch.Tensor:
        if adapter is None:
            return wire
        if adapter.kind == "bytes":
            return wire.view(dtype)
        return wire.to(dtype)
