"""Recording the op calls a dispatcher makes, as a `CallHook`: the first calls of each
signature (a few shapes each) with their small inputs copied to the host, and for each
paged KV cache only its dtype and per-block shape. The rollout gate replays them as
conformance cases at the shapes and dtypes production makes.

A recorder belongs to one dispatcher (one engine rank), so no other engine in the
process is touched. With a `directory` each kept call is also written to a file of its
own as soon as it is seen, before its kernel runs: a rank whose kernel then kills the
process (an illegal memory access, say) has still left the crashing call behind, and
the gate reads every rank's calls back from the folder (`read_recordings`)."""

from __future__ import annotations

import dataclasses
import os
from pathlib import Path
from typing import Any, Mapping

import torch

from .contracts import CONTRACTS
from .spec import OpContract

#: Distinct shapes kept per (op, dtype signature): prefill, decode and a mixed step.
MAX_SHAPES_PER_SIGNATURE = 3
#: Host memory all recorded copies may take together; later calls that do not fit are
#: counted, not kept. Caches never count: they are not copied.
MAX_RECORDED_BYTES = 512 << 20
#: The contract's symbol for a paged cache's number of blocks: tensors shaped by it
#: are caches, recorded by signature only.
BLOCKS_DIM = "NB"
#: A rank's folder inside a recording directory.
RANK_FOLDER = "rank{rank}"


@dataclasses.dataclass(frozen=True)
class CacheSignature:
    """What a replay needs of a production cache: its dtype and the shape of one
    block (block size, heads, head dim), not its contents."""

    dtype: torch.dtype
    block_shape: tuple[int, ...]

    @property
    def block_size(self) -> int:
        return self.block_shape[0]


@dataclasses.dataclass(frozen=True)
class RecordedCall:
    """One kept call: the op and its inputs by contract name (host copies, cache
    signatures, parameters), or `args` None for a call too large to keep. `prepared`
    names the weights the call got in the backend's load-time form (recorded as their
    plain values; a replay prepares them again, so the kernel path they took is the
    one checked)."""

    op: str
    args: Mapping[str, Any] | None
    prepared: tuple[str, ...] = ()


def cache_args(contract: OpContract) -> tuple[str, ...]:
    """The contract's paged-cache tensors (first dimension NB)."""
    return tuple(spec.name for spec in contract.tensors
                 if not isinstance(spec.shape, tuple) or spec.shape[:1] == (BLOCKS_DIM,))


class CallRecorder:
    """The hook: keeps the first calls of each signature (up to a few shapes each,
    profile_run's maxima among them) in `calls`, and in `directory` when given."""

    def __init__(self, directory: str | Path | None = None) -> None:
        self.directory = None if directory is None else Path(directory)
        if self.directory is not None:
            self.directory.mkdir(parents=True, exist_ok=True)
        self.calls: list[RecordedCall] = []
        self.recorded_bytes = 0
        self._shapes: dict[tuple[Any, ...], set[tuple[Any, ...]]] = {}

    @property
    def ops_called(self) -> list[str]:
        """The ops seen, in order of first call."""
        return list(dict.fromkeys(call.op for call in self.calls))

    @property
    def too_large(self) -> int:
        """Calls of a new shape that did not fit in MAX_RECORDED_BYTES."""
        return sum(call.args is None for call in self.calls)

    def __call__(self, op: str, call: Mapping[str, Any]) -> None:
        """Note one call's inputs (outputs are not allocated yet, so not seen)."""
        contract = CONTRACTS[op]
        inputs = {name: call[name] for name in contract.arg_names}
        caches = cache_args(contract)
        signature = (op, *(v.dtype if isinstance(v, torch.Tensor) else None for v in inputs.values()))
        shapes = tuple(
            (tuple(v.shape[1:]) if name in caches else tuple(v.shape)) if isinstance(v, torch.Tensor) else v
            for name, v in inputs.items()
        )
        seen = self._shapes.setdefault(signature, set())
        if shapes in seen or len(seen) >= MAX_SHAPES_PER_SIGNATURE:
            return
        seen.add(shapes)
        size = sum(v.numel() * v.element_size() for name, v in inputs.items()
                   if isinstance(v, torch.Tensor) and name not in caches)
        if self.recorded_bytes + size > MAX_RECORDED_BYTES:
            self._keep(RecordedCall(op, None))
            return
        self.recorded_bytes += size
        # Copies go to host memory, so recording during profile_run does not shrink the
        # device memory the engine then sizes its KV cache from; and they are made
        # outside inference_mode, so the conformance run may write into them.
        prepared = tuple(name for name, v in inputs.items() if isinstance(v, torch.Tensor) and _is_prepacked(v))
        with torch.inference_mode(False):
            self._keep(RecordedCall(op, {
                # An optional cache the call left out (V4's compressed cache on a
                # sliding-only layer) is recorded as the None it was.
                name: v if not isinstance(v, torch.Tensor) else CacheSignature(v.dtype, tuple(v.shape[1:]))
                if name in caches else _host_copy(v)
                for name, v in inputs.items()
            }, prepared))

    def _keep(self, recorded: RecordedCall) -> None:
        self.calls.append(recorded)
        if self.directory is not None:
            _write(self.directory / f"{len(self.calls):05d}.pt", recorded)


def _is_prepacked(tensor: torch.Tensor) -> bool:
    """Whether a backend prepacked this weight into an opaque layout (oneDNN's, for
    the cpu linear)."""
    return tensor.layout != torch.strided


def _host_copy(tensor: torch.Tensor) -> torch.Tensor:
    """A strided host copy of a recorded argument. A prepacked weight is recorded as
    its plain values: the contract's argument is the [N, K] matrix (the call's
    `prepared` names it, so replay prepacks it again)."""
    if _is_prepacked(tensor):
        tensor = tensor.to_dense()
    return tensor.to("cpu", copy=True)


def _write(path: Path, recorded: RecordedCall) -> None:
    """One call as a weights-only torch file (plain containers, tensors and dtypes, so
    reading it back runs no pickled code), written whole or not at all."""
    if recorded.args is None:
        payload: dict[str, Any] = {"op": recorded.op, "args": None, "caches": {}}
    else:
        payload = {
            "op": recorded.op,
            "prepared": list(recorded.prepared),
            "args": {k: v for k, v in recorded.args.items() if not isinstance(v, CacheSignature)},
            "caches": {k: (v.dtype, list(v.block_shape)) for k, v in recorded.args.items()
                       if isinstance(v, CacheSignature)},
        }
    partial = path.with_suffix(".partial")
    torch.save(payload, partial)
    os.replace(partial, path)


def _read(path: Path) -> RecordedCall:
    payload = torch.load(path, weights_only=True)
    if payload["args"] is None:
        return RecordedCall(payload["op"], None)
    caches = {k: CacheSignature(dtype, tuple(shape)) for k, (dtype, shape) in payload["caches"].items()}
    contract = CONTRACTS[payload["op"]]
    # Contract order, as the dispatcher bound them (replay names cases by it).
    merged = {**payload["args"], **caches}
    return RecordedCall(
        payload["op"], {name: merged[name] for name in contract.arg_names}, tuple(payload.get("prepared", ()))
    )


def rank_directory(directory: str | Path, rank: int) -> Path:
    """Where rank `rank` of a recording writes its calls."""
    return Path(directory) / RANK_FOLDER.format(rank=rank)


def read_recordings(directory: str | Path) -> dict[int, list[RecordedCall]]:
    """Every rank's recorded calls from a recording directory, by rank, in call order."""
    by_rank: dict[int, list[RecordedCall]] = {}
    prefix = RANK_FOLDER.format(rank="")
    for folder in sorted(Path(directory).glob(f"{prefix}*")):
        rank = int(folder.name.removeprefix(prefix))
        by_rank[rank] = [_read(path) for path in sorted(folder.glob("*.pt"))]
    return dict(sorted(by_rank.items()))


__all__ = [
    "BLOCKS_DIM", "CacheSignature", "CallRecorder", "MAX_RECORDED_BYTES", "MAX_SHAPES_PER_SIGNATURE",
    "RecordedCall", "cache_args", "rank_directory", "read_recordings",
]
