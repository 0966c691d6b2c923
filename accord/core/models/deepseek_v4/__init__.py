"""DeepseekV4ForCausalLM: hash-routed and top-k MoE, sliding / compressed-sparse (CSA) /
heavily-compressed (HCA) shared-KV attention over the paged cache, and mHC residual
streams. docs/deepseek_v4.md describes the KV layout and which parts are contracts.

Under tensor parallelism only the MoE is split (routed experts sliced or, with expert
parallelism, placed whole; the shared expert sliced); attention, the compressors and
the hyper-connections are replicated on every TP rank (each computes them alike)."""

from ...model_loader.model_config import ModelConfig
from ..contract_ops import FP8_LINEAR, GATED_MLP, MOE
from .config import parse_config
from .model import DeepseekV4, is_unused_tensor, load

#: The graph runs on tensor-parallel ranks (see above: the MoE split, attention replicated).
TENSOR_PARALLEL = True

#: Its norms (the hyper-connections add residuals themselves: no fused add), rotary
#: positions, projections; the shared-KV cache writes, the compressors' pooling, the
#: indexer's selection and the attention over sliding and compressed entries.
GRAPH = frozenset({
    "rms_norm", "rotary_embedding", "linear",
    "concat_and_cache_mla", "kv_compress", "indexer_topk", "compressed_attention",
})


def contract_ops(config: ModelConfig) -> frozenset[str]:
    """The op contracts the V4 graph calls (registry.ModelFamily.contract_ops)."""
    return GRAPH | MOE | GATED_MLP | (FP8_LINEAR if config.fp8_block is not None else frozenset())


__all__ = ["DeepseekV4", "contract_ops", "is_unused_tensor", "load", "parse_config"]
