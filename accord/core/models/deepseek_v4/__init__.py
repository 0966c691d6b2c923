"""DeepseekV4ForCausalLM: hash-routed and top-k MoE, sliding / compressed-sparse (CSA) /
heavily-compressed (HCA) shared-KV attention over the paged cache, and mHC residual
streams. docs/deepseek_v4.md describes the KV layout and which parts are contracts.

Under tensor parallelism only the MoE is split (routed experts sliced or, with expert
parallelism, placed whole; the shared expert sliced); attention, the compressors and
the hyper-connections are replicated on every TP rank (each computes them alike)."""

from .config import parse_config
from .model import DeepseekV4, is_unused_tensor, load

#: The graph runs on tensor-parallel ranks (see above: the MoE split, attention replicated).
TENSOR_PARALLEL = True

__all__ = ["DeepseekV4", "is_unused_tensor", "load", "parse_config"]
