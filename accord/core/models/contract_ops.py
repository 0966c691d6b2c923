"""Which op contracts a model's graph calls, from its config alone (before any weight
is read), so `--backend auto` can pass over a backend only for an op the model needs.

A family module may define `contract_ops(config)`; the decoder skeleton's is
`decoder_ops`. tests/models/test_models_contract_ops.py holds each family's answer to
the ops its tiny random model really calls.
"""

from __future__ import annotations

from ..model_loader.model_config import ModelConfig

#: Every decoder: its norms (fused with the residual add after the first), rotary
#: positions, the projections and the LM head.
DECODER = frozenset({"rms_norm", "fused_add_rms_norm", "rotary_embedding", "linear"})
#: A dense gated MLP (or an MoE's shared expert): its activation.
GATED_MLP = frozenset({"silu_and_mul"})
#: Grouped-query attention over the paged cache.
GQA_ATTENTION = frozenset({"reshape_and_cache", "paged_attention"})
#: Multi-head latent attention over the latent cache.
MLA_ATTENTION = frozenset({"concat_and_cache_mla", "mla_attention"})
#: Routed experts.
MOE = frozenset({"moe_route", "fused_moe"})
#: fp8 linears: activations quantised per call, then the scaled matmul.
FP8_LINEAR = frozenset({"quantize_fp8", "scaled_mm"})
#: Linears whose weights stay in a GGUF file's blocks.
QUANT_LINEAR = frozenset({"quant_linear"})
#: A token embedding kept in a GGUF file's blocks.
QUANT_EMBEDDING = frozenset({"quant_embedding"})
#: Linears of an AWQ / GPTQ / compressed-tensors checkpoint, kept as int4/int8 codes.
GROUP_QUANT_LINEAR = frozenset({"group_quant_linear"})


def decoder_ops(config: ModelConfig) -> frozenset[str]:
    """The decoder skeleton's ops for `config`: GQA or MLA attention, with routed
    experts where the config has them (and a gated MLP where a layer is dense or has a
    shared expert), fp8 linears for a block-fp8 checkpoint, group-quantised ones for an
    AWQ / GPTQ / compressed-tensors one."""
    ops = DECODER | (MLA_ATTENTION if config.mla is not None else GQA_ATTENTION)
    moe = config.moe
    if moe is not None:
        ops |= MOE
    if moe is None or moe.num_shared_experts > 0 or len(moe.sparse_layers) < config.num_layers:
        ops |= GATED_MLP
    if config.fp8_block is not None:
        ops |= FP8_LINEAR
    if config.group_quant is not None:
        ops |= GROUP_QUANT_LINEAR
    return ops
