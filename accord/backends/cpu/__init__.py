"""The cpu backend: every contract, fast on CPUs; the embedded default."""

from __future__ import annotations

from collections.abc import Callable

import torch

from ...op_contracts import KernelSet
from ..base import Backend
from . import capability
from .capability import BF16_PATH_VARIABLE, cpu_has_native_bf16

__all__ = ["BF16_PATH_VARIABLE", "CpuBackend", "cpu_has_native_bf16"]


class CpuBackend(Backend):
    """Fast kernels for x86/Arm CPUs; bf16 where the CPU computes it natively."""

    name = "cpu"
    device_type = "cpu"
    priority = 10
    dist_backend = "gloo"

    @property
    def description(self) -> str:  # type: ignore[override]
        """What `accord backends` says of it, with the fallback when no compiler is found."""
        notes = "fast CPU kernels (the embedded default)"
        return notes if capability.find_compiler() is not None else f"{notes}; {capability.NO_COMPILER_FALLBACK}"

    def load_kernels(self) -> KernelSet:
        from .kernels import KERNELS, start_native_builds
        from .malloc_tuning import tune_glibc_malloc

        start_native_builds()
        tune_glibc_malloc()
        return KERNELS

    def batch_variant_ops(self) -> frozenset[str]:
        # Grouping tokens by expert and torch's GEMMs pick their blocking by the number
        # of rows, so a row's rounding depends on its batch mates; routing scores go
        # through the same vectorised reductions; lora_linear groups rows by adapter slot;
        # quant_linear picks packed dots or dequantised tiles by the number of rows;
        # group_quant_linear's dequantised tiles go through torch's GEMMs.
        return frozenset({
            "moe_route", "fused_moe", "scaled_mm", "linear", "lora_linear", "quant_linear", "group_quant_linear",
        })

    def compute_dtype(self, requested: torch.dtype) -> torch.dtype:
        if requested in (torch.bfloat16, torch.float16) and not capability.cpu_has_native_bf16():
            return torch.float32
        return requested

    def prepare_linear_weight(self, weight: torch.Tensor) -> torch.Tensor:
        """Prepack into oneDNN's blocked layout where this CPU computes the dtype natively."""
        from .kernels.linear import prepack

        return prepack(weight)

    #: Its graphs are calls into accord's C kernels: inductor's compiled code runs
    #: outside them.
    captures_compiled_steps = False

    @property
    def captures_graphs(self) -> bool:  # type: ignore[override]
        """Whether decode steps are captured: where their GEMMs can run in native kernels
        (the bf16-weight GEMM of bf16 weights, or of exactly-bf16 fp32 ones, on fp32 or
        native bf16 activations) and the replay loop builds. A model whose step does
        anything else refuses the capture and runs eagerly."""
        from .kernels import _native_graph

        return self.max_graph_batch > 0 and _native_graph.available()

    @property
    def max_graph_batch(self) -> int:  # type: ignore[override]
        """The rows the bf16-weight GEMM serves (beyond them oneDNN's, an aten op a
        replay of native calls cannot repeat); 0 where it does not run."""
        from .kernels.linear import BF16_WEIGHT_MAX_ROWS, streams_bf16_weights

        return BF16_WEIGHT_MAX_ROWS if streams_bf16_weights() else 0

    def graph_capture(self, fn: Callable[[], torch.Tensor]) -> Callable[[], torch.Tensor]:
        """The step's native kernel calls, recorded once and replayed from C
        (`_native_graph`); raises `CaptureRefused` where the step does other work."""
        from .kernels import _native_graph

        graph, output = _native_graph.capture(fn)

        def replay() -> torch.Tensor:
            graph.replay()
            return output

        return replay
