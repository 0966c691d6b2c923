"""The reference backend: every contract in plain torch, fp32/fp64 accumulation, written
to be obviously correct. It is the golden every other backend is compared with."""

from __future__ import annotations

from ...op_contracts import KernelSet
from ..base import Backend


class ReferenceBackend(Backend):
    """Slow and obviously correct; conformance's golden."""

    name = "reference"
    device_type = "cpu"
    priority = 0
    dist_backend = "gloo"
    description = "plain torch, fp32/fp64 accumulation: the golden for conformance"

    def batch_variant_ops(self) -> frozenset[str]:
        # torch's vectorised softplus rounds a tensor's tail elements on another code
        # path, so a hash-routed row's weight bits depend on where it sits in the batch.
        return frozenset({"moe_route"})

    def load_kernels(self) -> KernelSet:
        from .kernels import KERNELS

        return KERNELS
