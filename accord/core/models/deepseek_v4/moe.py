"""DeepSeek-V4's MoE block: hash routing (tid2eid, first layers) or sqrt-softplus top-k
with a selection bias, both through ops.moe_route; routed experts through ops.fused_moe
with swiglu_limit; one shared expert, clipped the same way. Under expert parallelism a
rank routes its own tokens (so hash routing reads each token's own id) before the
expert dispatch carries them, picks included, to the ranks holding their experts.
Under tensor parallelism (and EP = TP, where no exchange is needed) the routed partial
sums are all_reduced over the TP group; the shared expert reduces its own (row-parallel
down projection)."""

from __future__ import annotations

import torch
import torch.nn.functional as F

from ....op_contracts import OpDispatcher
from ...distributed import ParallelContext
from ...model_loader.model_config import ModelConfig, MoeConfig
from ..layers import GatedMLP
from ..layers.mlp import RoutedExperts
from ..weights import ExpertWeights, WeightLoader

#: Expert projections under DeepSeek's names: gate, up, down.
EXPERT_NAMES = ("w1", "w3", "w2")


class V4MoE:
    """Routed + shared experts of one layer."""

    def __init__(
        self, ops: OpDispatcher, moe: MoeConfig, router: torch.Tensor, experts: ExpertWeights, shared: GatedMLP,
        swiglu_limit: float, hash_table: torch.Tensor | None = None, correction_bias: torch.Tensor | None = None,
        parallel: ParallelContext = ParallelContext.single(),
    ) -> None:
        self.ops = ops
        self.moe = moe
        self.router = router
        self.routed = RoutedExperts(ops, experts, moe.num_experts, parallel, swiglu_limit)
        self.comm = parallel.tp_comm()
        self.shared = shared
        self.swiglu_limit = swiglu_limit
        self.hash_table = hash_table
        self.correction_bias = correction_bias

    @classmethod
    def load(cls, weights: WeightLoader, prefix: str, config: ModelConfig, layer: int) -> V4MoE:
        """From `prefix.gate.{weight, tid2eid | bias}`, `prefix.experts.N.{w1,w2,w3}` and
        `prefix.shared_experts.{w1,w2,w3}`."""
        v4, hidden = config.v4, config.hidden_size
        assert v4 is not None, "DeepseekV4 always parses its config"
        moe = v4.moe
        router = weights.tensor(f"{prefix}.gate.weight", (moe.num_experts, hidden), torch.float32)
        hash_table = bias = None
        if v4.mlp_layer_types[layer] == "hash_moe":
            name = f"{prefix}.gate.tid2eid"
            # Kept at the checkpoint's own width (int32 in DeepSeek's release): the
            # contract takes either, and the width is what the motivating crash was about.
            stored = weights.checkpoint.read(name).dtype if name in weights.checkpoint else torch.int32
            hash_table = weights.tensor(name, (config.vocab_size, moe.top_k), stored)
        else:
            bias = weights.tensor(f"{prefix}.gate.bias", (moe.num_experts,), torch.float32)
        experts = weights.experts(f"{prefix}.experts", moe.num_experts, EXPERT_NAMES, hidden, moe.intermediate_size)
        shared = GatedMLP.load(
            weights, f"{prefix}.shared_experts", hidden, moe.intermediate_size * moe.num_shared_experts, EXPERT_NAMES
        )
        return cls(weights.ops, moe, router, experts, shared, v4.swiglu_limit, hash_table, bias, weights.parallel)

    def __call__(self, x: torch.Tensor, input_ids: torch.Tensor) -> torch.Tensor:
        """x [T, hidden] of the tokens `input_ids` [T] -> [T, hidden]."""
        moe = self.moe
        logits = F.linear(x.to(self.router.dtype), self.router)
        if self.hash_table is not None:
            weights, ids = self.ops.moe_route(
                logits, None, input_ids, self.hash_table, top_k=moe.top_k, scoring=moe.scoring, selection="hash",
                renormalize=True, routed_scaling_factor=moe.routed_scaling_factor,
            )
        else:
            weights, ids = self.ops.moe_route(
                logits, self.correction_bias, top_k=moe.top_k, scoring=moe.scoring, renormalize=True,
                routed_scaling_factor=moe.routed_scaling_factor,
            )
        routed = self.routed(x, weights, ids)
        if self.routed.dispatch is None and self.comm is not None:
            routed = self.comm.all_reduce(routed)  # TP slices or EP = TP ranks' experts: partial sums
        return routed + self._shared(x)

    def _shared(self, x: torch.Tensor) -> torch.Tensor:
        gate_up = self.shared.gate_up(x)
        if self.swiglu_limit > 0:
            half, limit = gate_up.shape[1] // 2, self.swiglu_limit
            gate_up = torch.cat([gate_up[:, :half].clamp(max=limit), gate_up[:, half:].clamp(-limit, limit)], dim=1)
        return self.shared.down(self.ops.silu_and_mul(gate_up))
