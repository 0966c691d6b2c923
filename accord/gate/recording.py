"""Records the op calls a real engine makes, so the gate can run conformance at the
shapes and dtypes the deploy config actually produces (not only the standard cases).

The engine takes a backend by name and builds its own dispatcher, so the recorder
wraps the backend's `kernel_for` for the duration of a `with` block: every kernel the
dispatcher plans with is then a recording copy of the real one.

A call is replayed by its signature, never with the production KV cache: a cache
holds the whole KV budget (gigabytes on a real node), and replaying it would copy it
several times over. The recorder keeps the call's small tensors (activations and the
batch's block metadata) and, for each paged cache, only its dtype and per-block
shape; the replayed case gets a cache of as many generated blocks as the batch
touches (plus a spare), with its block tables and slot mapping renumbered onto them."""

from __future__ import annotations

import dataclasses
from contextlib import contextmanager
from typing import Any, Iterator

import torch

from ..backends import Backend
from ..op_contracts import CONTRACTS, Kernel, OpContract
from ..conformance.case import Case, dtype_combo, randn, seeded

#: Distinct shapes kept per (op, dtype combination): prefill, decode and a mixed step.
MAX_SHAPES_PER_SIGNATURE = 3
#: Host memory all recorded copies may take together; later calls that do not fit are
#: counted, not kept (their ops still run the standard cases). Caches never count:
#: they are not copied.
MAX_RECORDED_BYTES = 512 << 20
#: The contract's symbol for a paged cache's number of blocks: tensors shaped by it
#: are caches, replayed on generated blocks.
BLOCKS_DIM = "NB"


@dataclasses.dataclass(frozen=True)
class CacheSignature:
    """What a replay needs of a production cache: its dtype and the shape of one
    block (block size, heads, head dim), not its contents."""

    dtype: torch.dtype
    block_shape: tuple[int, ...]

    @property
    def block_size(self) -> int:
        return self.block_shape[0]


def cache_args(contract: OpContract) -> tuple[str, ...]:
    """The contract's paged-cache tensors (first dimension NB)."""
    return tuple(spec.name for spec in contract.tensors
                 if not isinstance(spec.shape, tuple) or spec.shape[:1] == (BLOCKS_DIM,))


class CallRecorder:
    """Keeps the first calls of each op signature (up to a few shapes each,
    profile_run's maxima among them); `cases()` turns them into cases."""

    def __init__(self, seed: int = 0) -> None:
        self.seed = seed
        self.calls: dict[tuple[str, str], dict[tuple[Any, ...], dict[str, Any]]] = {}
        self.ops_called: list[str] = []
        self.too_large = 0
        self.recorded_bytes = 0

    def record(self, op: str, call: dict[str, Any]) -> None:
        """Note one call's inputs (outputs the dispatcher allocated are left out)."""
        if op not in self.ops_called:
            self.ops_called.append(op)
        contract = CONTRACTS[op]
        inputs = {name: call[name] for name in contract.arg_names}
        caches = cache_args(contract)
        shapes = tuple(
            (tuple(v.shape[1:]) if name in caches else tuple(v.shape)) if isinstance(v, torch.Tensor) else v
            for name, v in inputs.items()
        )
        seen = self.calls.setdefault((op, dtype_combo(contract, inputs)), {})
        if shapes in seen or len(seen) >= MAX_SHAPES_PER_SIGNATURE:
            return
        size = sum(v.numel() * v.element_size() for name, v in inputs.items()
                   if isinstance(v, torch.Tensor) and name not in caches)
        if self.recorded_bytes + size > MAX_RECORDED_BYTES:
            self.too_large += 1
            return
        self.recorded_bytes += size
        # Copies go to host memory, so recording during profile_run does not shrink the
        # device memory the engine then sizes its KV cache from; and they are made
        # outside inference_mode, so the conformance run may write into them.
        with torch.inference_mode(False):
            seen[shapes] = {
                name: CacheSignature(v.dtype, tuple(v.shape[1:])) if name in caches
                else _host_copy(v) if isinstance(v, torch.Tensor) else v
                for name, v in inputs.items()
            }

    def cases(self) -> dict[str, list[Case]]:
        """The recorded calls as cases, by op, named by their shapes (on the host, like
        generated cases: the runner moves them to each backend's device)."""
        by_op: dict[str, list[Case]] = {}
        for (op, _combo), calls in self.calls.items():
            for index, recorded in enumerate(calls.values()):
                args = replay_args(op, recorded, seeded(self.seed, "recorded", op, _combo, index))
                by_op.setdefault(op, []).append(Case(op, f"recorded {_shape_label(args)}", args))
        return by_op

    def wrap(self, kernel: Kernel) -> Kernel:
        """A copy of `kernel` that records each call before running it."""
        def fn(**call: Any) -> None:
            self.record(kernel.op, call)
            kernel.fn(**call)

        return dataclasses.replace(kernel, fn=fn)


def _host_copy(tensor: torch.Tensor) -> torch.Tensor:
    """A strided host copy of a recorded argument. A weight a backend prepacked into an
    opaque layout (oneDNN's, for the cpu linear) is recorded as its plain values: the
    contract's argument is the [N, K] matrix, and replay hands kernels plain tensors."""
    if tensor.layout != torch.strided:
        tensor = tensor.to_dense()
    return tensor.to("cpu", copy=True)


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


def _shape_label(args: dict[str, Any]) -> str:
    return " ".join(f"{name}={list(v.shape)}" for name, v in args.items() if isinstance(v, torch.Tensor))


@contextmanager
def recording_calls(backend: Backend, seed: int = 0) -> Iterator[CallRecorder]:
    """Within the block, every kernel `backend` hands out records its calls."""
    recorder = CallRecorder(seed)
    original = backend.kernel_for

    def kernel_for(op: str) -> Kernel | None:
        kernel = original(op)
        return None if kernel is None else recorder.wrap(kernel)

    # An instance attribute shadows the method only for this block (see module doc).
    backend.kernel_for = kernel_for  # type: ignore[method-assign]
    try:
        yield recorder
    finally:
        del backend.kernel_for
