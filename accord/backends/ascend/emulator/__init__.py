"""A CPU emulator of the torch-npu operators the ascend backend calls, enabled by
ACCORD_NPU_EMULATE=1. Each operator checks the dtypes, ranks, layouts and value
ranges torch-npu documents for it (Atlas A2/A3 generation) and refuses a call outside
them with NpuOperatorError, as the chip's operator would fail; then it computes the
documented formula in plain torch. It proves the backend's glue (layouts, adapters,
dtype claims, output handling), never the NPU kernels' numerics or speed."""

from __future__ import annotations

from ._checks import NpuOperatorError
from .attention import npu_fused_infer_attention_score
from .cache import npu_scatter_nd_update_, npu_scatter_pa_kv_cache
from .elementwise import npu_add_rms_norm, npu_clipped_swiglu, npu_rms_norm, npu_rotary_mul, npu_swiglu
from .moe import (
    npu_grouped_matmul,
    npu_moe_compute_expert_tokens,
    npu_moe_finalize_routing,
    npu_moe_gating_top_k,
    npu_moe_gating_top_k_softmax,
    npu_moe_init_routing,
)

#: The chip the emulator stands for: the generation whose documented restrictions it
#: enforces (Atlas 800I A2, as `torch.npu.get_device_name()` names it).
EMULATED_SOC = "Ascend910B3"

__all__ = [
    "EMULATED_SOC",
    "NpuOperatorError",
    "npu_add_rms_norm",
    "npu_clipped_swiglu",
    "npu_fused_infer_attention_score",
    "npu_grouped_matmul",
    "npu_moe_compute_expert_tokens",
    "npu_moe_finalize_routing",
    "npu_moe_gating_top_k",
    "npu_moe_gating_top_k_softmax",
    "npu_moe_init_routing",
    "npu_rms_norm",
    "npu_rotary_mul",
    "npu_scatter_nd_update_",
    "npu_scatter_pa_kv_cache",
    "npu_swiglu",
]
