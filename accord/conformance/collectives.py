"""Collective conformance: every collective of a backend's communicator, over the dtypes
its contract names (natively carried, adapted, refused), run on `world_size` spawned
ranks and compared with the result computed locally from every rank's seeded input.

Each rank can rebuild every other rank's input from (seed, case, rank), so the expected
output (a sum in fp64 rounded once to the dtype, or a concatenation) needs no wire.
Float inputs carry a full mantissa of their dtype, so a reduction carried out in a
narrower dtype than the one it was given shows. With two ranks a reduction rounds once,
so every result must match bit for bit; with more, each partial sum may round once, and
the bound is that many half-ulps of the dtype at the sum of magnitudes. Cases
include a rank that contributes zero tokens. A dtype the contract refuses must raise
ContractError; one it adapts must run and be counted as adapted.
"""

from __future__ import annotations

import zlib
from dataclasses import dataclass
from typing import Sequence

import torch

from ..backends.communicator import COLLECTIVES, REDUCTIONS, TorchCommunicator
from ..op_contracts import ContractError, dtype_name
from .ranks import spawn_ranks

HIDDEN = 8
#: Every dtype a case is generated for: the communicators' common set, fp8, and one no
#: communicator declares (complex64), which must be refused.
DTYPES = (
    torch.float32, torch.bfloat16, torch.float16, torch.int32, torch.int64,
    torch.float8_e4m3fn, torch.float8_e5m2, torch.complex64,
)
#: (name, tokens each rank contributes); "zero-rank" has a rank with no tokens.
LAYOUTS = (("even", None), ("zero-rank", 0))


@dataclass(frozen=True)
class CollectiveCase:
    """One collective on one dtype and token layout."""

    collective: str
    dtype: torch.dtype
    layout: str

    @property
    def name(self) -> str:
        """collective[dtype,layout], as reports show it."""
        return f"{self.collective}[{dtype_name(self.dtype)},{self.layout}]"


@dataclass(frozen=True)
class CollectiveResult:
    """What one case did on one rank: passed, adapted (ran through a declared adapter
    and passed), refused (as the contract says), or failed with a reason."""

    case: str
    rank: int
    status: str
    detail: str = ""


def collective_cases() -> list[CollectiveCase]:
    """Every (collective, dtype, layout) case, in a fixed order."""
    return [CollectiveCase(c, d, layout) for c in COLLECTIVES for d in DTYPES for layout, _ in LAYOUTS]


def _tokens(case: CollectiveCase, rank: int, world_size: int) -> int:
    """Rows rank `rank` contributes: 2 per rank, but the last rank none in "zero-rank"
    (reduce_scatter needs equal rows on every rank, so there all ranks have none)."""
    if case.layout == "even":
        return 2 * world_size if case.collective == "reduce_scatter" else 2
    if case.collective in REDUCTIONS:
        return 0
    return 0 if rank == world_size - 1 else 3


def _input(case: CollectiveCase, rank: int, world_size: int, seed: int) -> torch.Tensor:
    # crc32, not hash(): every rank must derive the same inputs in its own process.
    generator = torch.Generator().manual_seed(zlib.crc32(f"{seed}/{case.name}/{rank}".encode()))
    rows = _tokens(case, rank, world_size)
    if case.dtype.is_floating_point or case.dtype.is_complex:
        # Normal values rounded once to the dtype: every mantissa bit in use.
        return (torch.randn((rows, HIDDEN), generator=generator, dtype=torch.float64) * 4).to(case.dtype)
    return torch.randint(-1000, 1000, (rows, HIDDEN), generator=generator).to(case.dtype)


def _split_sizes(rows_of: Sequence[int], rank: int, world_size: int) -> tuple[list[int], list[int]]:
    """all_to_all splits: rank r sends its rows to the ranks in turn, the first rank
    getting the remainder; (output sizes, input sizes) for `rank`."""

    def sends(src: int) -> list[int]:
        share = rows_of[src] // world_size
        return [share + (rows_of[src] % world_size if dst == 0 else 0) for dst in range(world_size)]

    return [sends(src)[rank] for src in range(world_size)], sends(rank)


def _expected(case: CollectiveCase, inputs: list[torch.Tensor], rank: int, world_size: int) -> torch.Tensor:
    if case.collective == "all_reduce":
        return torch.stack([x.double() for x in inputs]).sum(0).to(case.dtype)
    if case.collective == "reduce_scatter":
        total = torch.stack([x.double() for x in inputs]).sum(0).to(case.dtype)
        return total.chunk(world_size)[rank] if total.shape[0] else total
    if case.collective == "all_gather":
        return torch.cat(inputs)
    rows_of = [x.shape[0] for x in inputs]
    pieces = []
    for src in range(world_size):
        _, src_sends = _split_sizes(rows_of, src, world_size)
        start = sum(src_sends[:rank])
        pieces.append(inputs[src][start : start + src_sends[rank]])
    return torch.cat(pieces)


def _run(comm: TorchCommunicator, case: CollectiveCase, x: torch.Tensor, rows_of: list[int]) -> torch.Tensor:
    if case.collective == "all_reduce":
        return comm.all_reduce(x)
    if case.collective == "reduce_scatter":
        return comm.reduce_scatter(x)
    if case.collective == "all_gather":
        return comm.all_gather(x, dim=0, sizes=rows_of)
    output_sizes, input_sizes = _split_sizes(rows_of, comm.rank, comm.world_size)
    return comm.all_to_all(x, output_sizes, input_sizes)


def run_case(comm: TorchCommunicator, case: CollectiveCase, seed: int) -> CollectiveResult:
    """One case on this rank (every rank runs the same cases in the same order)."""
    rank, world_size = comm.rank, comm.world_size
    inputs = [_input(case, r, world_size, seed) for r in range(world_size)]
    rows_of = [x.shape[0] for x in inputs]
    try:
        adapter = comm.support.plan(case.collective, case.dtype)
    except ContractError as refusal:
        try:
            _run(comm, case, inputs[rank], rows_of)
        except ContractError:
            return CollectiveResult(case.name, rank, "refused", f"as declared: carries {refusal.expected}")
        return CollectiveResult(case.name, rank, "failed", "declared refused, but the communicator ran it")
    before = sum(comm.adapter_counts.values())
    try:
        got = _run(comm, case, inputs[rank], rows_of)
    except Exception as error:  # a crash on the wire is this case's failure, not the suite's
        return CollectiveResult(case.name, rank, "failed", f"{type(error).__name__}: {error}")
    expected = _expected(case, inputs, rank, world_size)
    counted = sum(comm.adapter_counts.values()) - before
    if got.dtype != case.dtype or got.shape != expected.shape:
        return CollectiveResult(
            case.name, rank, "failed", f"got {dtype_name(got.dtype)}{tuple(got.shape)}, expected "
            f"{dtype_name(expected.dtype)}{tuple(expected.shape)}",
        )
    if (mismatch := _mismatch(case, got, expected, inputs, rank)) is not None:
        return CollectiveResult(case.name, rank, "failed", mismatch)
    if adapter is not None:
        if counted != 1:
            return CollectiveResult(case.name, rank, "failed", f"adapter applied but counted {counted} times")
        return CollectiveResult(case.name, rank, "adapted", adapter.describe(case.dtype))
    return CollectiveResult(case.name, rank, "passed")


def _mismatch(
    case: CollectiveCase, got: torch.Tensor, expected: torch.Tensor, inputs: list[torch.Tensor], rank: int
) -> str | None:
    """Why `got` is not the locally computed result: other bits where the result is
    exact (gathers, integers, a two-rank sum, which rounds once), or, for a float sum
    over more ranks, an error past (ranks - 1) half-ulps of the dtype at the sum of the
    inputs' magnitudes (each partial sum rounding once)."""
    if torch.equal(_bits(got), _bits(expected)):
        return None
    ranks = len(inputs)
    if case.collective not in REDUCTIONS or not case.dtype.is_floating_point or ranks <= 2:
        return "result differs from the locally computed one (it must match bit for bit)"
    magnitude = torch.stack([x.double().abs() for x in inputs]).sum(0)
    if case.collective == "reduce_scatter" and magnitude.shape[0]:
        magnitude = magnitude.chunk(ranks)[rank]
    bound = (ranks - 1) * torch.finfo(case.dtype).eps / 2 * magnitude
    error = (got.double() - expected.double()).abs()
    if error.shape != bound.shape or bool((error > bound).any()):
        return f"result differs from the fp64 sum by more than {ranks - 1} roundings of {dtype_name(case.dtype)}"
    return None


def _bits(x: torch.Tensor) -> torch.Tensor:
    """`x` as comparable bits (torch.equal has no fp8 kernel)."""
    return x.view(torch.uint8) if x.dtype.is_floating_point and x.element_size() == 1 else x


def _run_cases(comm: TorchCommunicator, seed: int) -> list[CollectiveResult]:
    """Every case on one rank."""
    return [run_case(comm, case, seed) for case in collective_cases()]


def run_collective_conformance(backend_name: str, world_size: int = 2, seed: int = 0) -> list[CollectiveResult]:
    """Every collective case on `world_size` spawned ranks of `backend_name`; the results
    of all ranks, rank by rank."""
    per_rank = spawn_ranks(_run_cases, seed, backend_name=backend_name, world_size=world_size)
    return [result for results in per_rank for result in results]


def render_collectives(results: list[CollectiveResult]) -> str:
    """One line per case: its status on every rank, and why when it did not pass."""
    by_case: dict[str, list[CollectiveResult]] = {}
    for result in results:
        by_case.setdefault(result.case, []).append(result)
    lines = []
    for case, per_rank in by_case.items():
        statuses = sorted({r.status for r in per_rank})
        detail = next((r.detail for r in per_rank if r.status == "failed"), per_rank[0].detail)
        lines.append(f"{case:<40} {'/'.join(statuses):<10} {detail}".rstrip())
    failed = sum(1 for per_rank in by_case.values() if any(r.status == "failed" for r in per_rank))
    lines.append(f"{len(by_case)} collective cases on {len({r.rank for r in results})} ranks, {failed} failed")
    return "\n".join(lines)
