"""The Backend base class: every decision that belongs to a device vendor, in one place.

The surface is wide on purpose (DESIGN.md): kernels per contract, but also the KV block
shape and block sizes, the fp8 storage format, the distributed backend, memory queries,
compute dtype and graph capture, so a vendor plugin never has to monkey-patch the core.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Callable, ClassVar, Mapping

import torch
import torch.distributed as dist

from ..op_contracts import Kernel, KernelSet
from .communicator import SUPPORT_BY_BACKEND, CollectiveSupport, TorchCommunicator



@dataclass(frozen=True)
class Availability:
    """Whether a backend can run here, and why not when it cannot. `auto_selectable`
    False keeps a backend that runs but must not serve by default (an emulator) out of
    `--backend auto`."""

    available: bool
    reason: str = ""
    auto_selectable: bool = True


@dataclass(frozen=True)
class ToleranceOverride:
    """A declared, documented widening of an op's tolerance for one backend mode (the
    Triton interpreter's bf16 rounding, say). Conformance prints it beside the result;
    it is never applied silently."""

    nmse: float
    reason: str


class Backend:
    """Base class for a backend plugin. Subclasses set the class attributes and
    implement `load_kernels`; everything else has a sensible default to override."""

    #: Public members core does not call yet, each with why a plugin may still set it;
    #: every other public member is part of what core calls (a test holds both).
    OPTIONAL_HOOKS: ClassVar[Mapping[str, str]] = {}

    name: str = ""
    device_type: str = "cpu"
    #: Higher wins for `--backend auto` among available backends.
    priority: int = 0
    #: The communicator this device's collectives use (gloo/nccl/rccl/hccl).
    dist_backend: str = "gloo"
    description: str = ""

    def __init__(self) -> None:
        self._kernels: KernelSet | None = None

    # -- availability and kernels ------------------------------------------------
    def availability(self) -> Availability:
        """Whether this backend can run on this host; must not raise."""
        return Availability(True)

    def load_kernels(self) -> KernelSet:
        """Import and return this backend's kernels (called once, on first use)."""
        raise NotImplementedError

    def kernels(self) -> KernelSet:
        """The kernel table, loaded lazily so listing backends imports no vendor code."""
        if self._kernels is None:
            self._kernels = self.load_kernels()
        return self._kernels

    def kernel_for(self, op: str, batch_invariant: bool = False) -> Kernel | None:
        """This backend's kernel for `op`, or None when it has none. With
        `batch_invariant`, the kernel `--batch-invariant` runs: the op's registered
        batch-invariant variant, or its default kernel where that claims invariance or
        the backend does not declare the op batch-variant (conformance fails every case
        where such a kernel's rows depend on their batch mates); else None."""
        if not batch_invariant:
            return self.kernels().get(op)
        default = self.kernels().get(op)
        if op not in self.batch_variant_ops() and default is not None:
            return default
        return self.kernels().invariant(op)

    # -- device decisions ----------------------------------------------------------
    def device(self) -> torch.device:
        """The torch device tensors for this backend live on."""
        return torch.device(self.device_type)

    def fp8_dtype(self) -> torch.dtype:
        """The fp8 storage format of this device (OCP e4m3fn unless the device's
        architecture says otherwise; decided at run time, never by vendor name)."""
        return torch.float8_e4m3fn

    def prepare_fp8_weight(self, weight: torch.Tensor, scale: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Convert an fp8 weight stored as OCP e4m3fn (the core's format) and its scale
        to this device's fp8 format at load time; unchanged by default."""
        return weight, scale

    def prepare_linear_weight(self, weight: torch.Tensor) -> torch.Tensor:
        """The form of a dense [N, K] weight this backend's `linear` kernel wants, made once
        at load (a prepacked GEMM layout, say); the weight unchanged by default. The
        result keeps the logical shape and dtype and is only valid on this backend."""
        return weight

    def compute_dtype(self, requested: torch.dtype) -> torch.dtype:
        """The dtype to compute in when a model asks for `requested` (a CPU without
        native bf16 GEMMs computes bf16 models in fp32, say)."""
        return requested

    def memory_info(self) -> tuple[int, int]:
        """(free, total) bytes of the memory KV caches are carved from."""
        pages, page_size = os.sysconf("SC_PHYS_PAGES"), os.sysconf("SC_PAGE_SIZE")
        available = os.sysconf("SC_AVPHYS_PAGES")
        return available * page_size, pages * page_size

    def device_count(self) -> int | None:
        """Devices of this kind on this host, one per rank; None where every rank shares
        one device (CPUs), so any number of ranks fits."""
        return None

    def kv_cache_shape(self, num_blocks: int, block_size: int, num_kv_heads: int, head_size: int) -> tuple[int, ...]:
        """Shape of one layer's key (or value) cache. The contracts' layout by default."""
        return (num_blocks, block_size, num_kv_heads, head_size)

    def supported_block_sizes(self) -> tuple[int, ...] | None:
        """KV block sizes the attention kernels take; None for any positive size."""
        return None

    def tolerance_override(self, op: str, dtypes: Mapping[str, torch.dtype]) -> ToleranceOverride | None:
        """A declared tolerance widening for a call of `op` whose tensors have `dtypes`
        (argument and output name -> dtype, absent optionals left out), or None."""
        return None

    def nondeterministic_ops(self) -> frozenset[str]:
        """Ops whose identical calls may give different bits here (atomics, split-K
        reductions). Conformance reports the declaration and fails every other op that
        is not bit-deterministic."""
        return frozenset()

    def batch_variant_ops(self) -> frozenset[str]:
        """Ops whose row, sequence or token results may depend on their batch mates here
        (a kernel that picks its split or tile by batch size). Conformance reports the
        declaration and fails every other op that is not batch invariant; a deploy can
        require invariance even of these."""
        return frozenset()

    # -- collectives -----------------------------------------------------------------
    def process_group_backend(self) -> str:
        """The name torch.distributed.init_process_group takes for `dist_backend` (RCCL,
        say, is reached through torch's "nccl")."""
        return self.dist_backend

    def join_world(self, rank: int, world_size: int, init_method: str) -> None:
        """Join a torch.distributed world of `world_size` ranks as `rank` (`init_method`
        e.g. tcp://host:port) through this device's communicator, bound to this rank's
        device first."""
        # Every rank of one world lives on one host for now: the local rank is the rank.
        self.select_device(rank)
        dist.init_process_group(self.process_group_backend(), init_method=init_method, rank=rank, world_size=world_size)

    def select_device(self, local_rank: int) -> None:
        """Make the device of local rank `local_rank` this process's default before it
        joins the world (one GPU per rank); a no-op where ranks share the device (CPUs)."""

    def collective_support(self) -> CollectiveSupport:
        """The dtype contract of this device's communicator: what each collective carries
        natively and the declared adapters for the rest."""
        if self.dist_backend not in SUPPORT_BY_BACKEND:
            raise NotImplementedError(
                f"backend {self.name!r}: no collective dtype contract is built in for {self.dist_backend!r}; "
                "override Backend.collective_support"
            )
        return SUPPORT_BY_BACKEND[self.dist_backend]

    def communicator(self, group: object) -> TorchCommunicator:
        """The communicator the model's collectives go through, over one process group
        of an initialised torch.distributed world."""
        return TorchCommunicator(group, self.collective_support())

    #: Whether `graph_capture` records a real graph (the model runner captures the decode
    #: step only then). A CPU replay that re-executes the step gains nothing (its host
    #: cost is the step itself, and its kernels plan from tensor values on the host), so
    #: the default is False and such backends run every step eagerly.
    captures_graphs: bool = False
    #: The largest decode batch whose step this backend can capture (None: no limit of
    #: its own; the engine's max_cudagraph_capture_size still applies).
    max_graph_batch: int | None = None
    #: Whether a capture records a torch.compile'd step too (a CUDA graph records every
    #: kernel launched, inductor's included). A backend recording only its own kernels
    #: would miss the compiled code's: the engine then captures nothing under -O.
    captures_compiled_steps: bool = True

    def graph_capture(self, fn: Callable[[], torch.Tensor]) -> Callable[[], torch.Tensor]:
        """Capture a no-argument step over persistent buffers into a replay that returns
        its (static) output (accord.core.worker.graph_capture keeps the books); by default the
        replay runs the step again, which is what a device without graphs does. Raises
        NotImplementedError (a subclass) for a step this device cannot record, which
        then runs eagerly."""
        return fn

    def synchronize(self) -> None:
        """Wait for queued device work (a no-op on the CPU)."""

    def versions(self) -> dict[str, str]:
        """Versions of the runtime libraries this backend depends on, for reports."""
        return {"torch": torch.__version__}

    def __repr__(self) -> str:
        return f"<{type(self).__name__} {self.name!r} on {self.device_type}>"
