"""Turns the op calls a deploy's engine recorded (each rank through its dispatcher's
`CallRecorder` hook, into a folder the gate reads back) into conformance cases, so the
gate runs conformance at the shapes and dtypes the deploy config actually produces on
every rank, not only the standard cases.

Each rank's distinct signatures are replayed once: a call two ranks made alike (same op,
dtypes and shapes) is one case naming both ranks, and a signature only one rank made
(an expert-parallel rank's expert_map, a rank-specific index dtype) is a case of its own.

A call is replayed by its signature, never with the production KV cache: a cache
holds the whole KV budget (gigabytes on a real node), and replaying it would copy it
several times over. The recorder keeps the call's small tensors (activations and the
batch's block metadata) and, for each paged cache, only its dtype and per-block
shape; the replayed case gets a cache of as many generated blocks as the batch
touches (plus a spare), with its block tables and slot mapping renumbered onto them."""

from __future__ import annotations

import dataclasses
from typing import Any, Mapping, Sequence

import torch

from ..op_contracts import CONTRACTS
from ..op_contracts.recording import CacheSignature, RecordedCall, cache_args
from ..conformance.case import Case, dtype_combo, randn, seeded
from .reports.document import RecordedSignature


@dataclasses.dataclass(frozen=True)
class Recording:
    """What the deploy's ranks recorded, as the op stage and the report need it."""

    #: Replay cases by op (one per distinct signature over all ranks).
    cases: Mapping[str, list[Case]]
    #: The ops called on any rank, in order of first call.
    ops_called: list[str]
    #: Per rank, every distinct signature it called (the report's per-rank table).
    signatures: tuple[RecordedSignature, ...]
    #: Calls of a new shape too large to keep (their ops still run their standard cases).
    too_large: int


def recorded_cases(recordings: Mapping[int, Sequence[RecordedCall]], seed: int = 0) -> Recording:
    """The ranks' recorded calls (by rank) as replay cases (on the host, like generated
    cases: the runner moves them to each backend's device)."""
    by_key: dict[tuple[str, str, str], list[int]] = {}
    first: dict[tuple[str, str, str], RecordedCall] = {}
    ops_called: list[str] = []
    too_large = 0
    for rank, calls in recordings.items():
        for call in calls:
            if call.op not in ops_called:
                ops_called.append(call.op)
            if call.args is None:
                too_large += 1
                continue
            key = (call.op, dtype_combo(CONTRACTS[call.op], call.args), _signature_label(call))
            by_key.setdefault(key, []).append(rank)
            first.setdefault(key, call)
    cases: dict[str, list[Case]] = {}
    signatures = []
    several_ranks = len(recordings) > 1
    for key, ranks in by_key.items():
        op, _combo, label = key
        name = f"recorded {label}" + (f" on rank{'s' if len(ranks) > 1 else ''} {','.join(map(str, ranks))}"
                                      if several_ranks else "")
        recorded = first[key]
        case = Case(op, name, replay_args(op, recorded.args, seeded(seed, "recorded", op, name)),
                    prepared=recorded.prepared)
        cases.setdefault(op, []).append(case)
        signatures += [RecordedSignature(rank, op, case.combo, name) for rank in ranks]
    signatures.sort(key=lambda s: s.rank)
    return Recording(cases, ops_called, tuple(signatures), too_large)


def _signature_label(call: RecordedCall) -> str:
    """A call's shapes as text: each tensor present (a cache by its per-block shape), and
    each parameter that is not a dtype (the dtype combination names those)."""
    parts = []
    for name, value in call.args.items():
        if isinstance(value, CacheSignature):
            parts.append(f"{name}=[NB, {', '.join(map(str, value.block_shape))}]")
        elif isinstance(value, torch.Tensor):
            parts.append(f"{name}={list(value.shape)}")
        elif value is not None and not isinstance(value, torch.dtype):
            parts.append(f"{name}={value}")
    return " ".join(parts)


def replay_args(op: str, recorded: dict[str, Any], generator: torch.Generator) -> dict[str, Any]:
    """A recorded call's arguments with each cache signature made a cache of generated
    blocks: only the blocks the call's block tables or slot mapping reach (renumbered
    in order of first use), plus one spare that unused table entries point at."""
    caches = [name for name, v in recorded.items() if isinstance(v, CacheSignature)]
    if not caches:
        return dict(recorded)
    block_size = recorded[caches[0]].block_size
    args = dict(recorded)
    used = _used_blocks(args, block_size)
    spare = len(used)
    # lookup[old block] = new block; blocks the call never reaches map to the spare.
    lookup = torch.full((int(used.max()) + 2 if spare else 1,), spare, dtype=torch.int64)
    lookup[used] = torch.arange(spare)
    if (tables := args.get("block_tables")) is not None:
        live = torch.arange(tables.shape[1])[None, :] < _blocks_per_sequence(args, block_size)[:, None]
        reached = lookup[tables.long().clamp(0, lookup.numel() - 1)]
        args["block_tables"] = torch.where(live, reached, spare).to(tables.dtype)
    if (slots := args.get("slot_mapping")) is not None:
        wide = slots.long()
        moved = lookup[(wide // block_size).clamp(0, lookup.numel() - 1)] * block_size + wide % block_size
        args["slot_mapping"] = torch.where(wide < 0, wide, moved).to(slots.dtype)
    for name in caches:
        signature: CacheSignature = recorded[name]
        args[name] = randn(generator, (spare + 1, *signature.block_shape), signature.dtype)
    return args


def _blocks_per_sequence(args: dict[str, Any], block_size: int) -> torch.Tensor:
    if "seq_lens" not in args:  # an op that reads its tables whole (kv_compress)
        tables = args["block_tables"]
        return torch.full((tables.shape[0],), tables.shape[1], dtype=torch.int64)
    return (args["seq_lens"].long() + block_size - 1) // block_size


def _used_blocks(args: dict[str, Any], block_size: int) -> torch.Tensor:
    """The physical blocks a call reads or writes, in order of first use."""
    reached = []
    if (tables := args.get("block_tables")) is not None:
        for row, count in zip(tables.long(), _blocks_per_sequence(args, block_size).tolist()):
            reached.append(row[:count])
    if (slots := args.get("slot_mapping")) is not None:
        slots = slots.long()
        reached.append(slots[slots >= 0] // block_size)
    ordered = torch.cat(reached) if reached else torch.zeros(0, dtype=torch.int64)
    unique, inverse = torch.unique(ordered, return_inverse=True)
    first = torch.full((unique.numel(),), ordered.numel(), dtype=torch.int64).scatter_reduce(
        0, inverse, torch.arange(ordered.numel()), "amin")
    return unique[first.argsort()]


__all__ = ["CacheSignature", "Recording", "cache_args", "recorded_cases", "replay_args"]
