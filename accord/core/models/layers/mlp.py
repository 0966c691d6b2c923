"""Feed-forward blocks: the gated (SwiGLU) MLP and the routed mixture of experts."""

from __future__ import annotations

import torch
import torch.nn.functional as F

from ....op_contracts import OpDispatcher
from ...distributed import ParallelContext
from ...distributed.expert_dispatch import expert_dispatch
from ...distributed.sharding import split_evenly
from ...model_config import MoeConfig
from ..weights import ExpertWeights, WeightLoader
from .linear import Linear


class GatedMLP:
    """down(silu(gate(x)) * up(x)), with gate and up fused into one GEMM. Under tensor
    parallelism gate/up are column-parallel and down row-parallel over the intermediate
    channels."""

    def __init__(self, ops: OpDispatcher, gate_up: Linear, down: Linear) -> None:
        self.ops = ops
        self.gate_up = gate_up
        self.down = down

    @classmethod
    def load(
        cls, weights: WeightLoader, prefix: str, hidden: int, intermediate: int,
        names: tuple[str, str, str] = ("gate_proj", "up_proj", "down_proj"), reduce: bool = True,
    ) -> GatedMLP:
        """From `prefix.{gate,up,down}` (names in that order). `reduce` False leaves the
        sum over the ranks to the caller (shared experts join the routed ones' sum)."""
        gate, up, down = names
        channels = split_evenly(weights.parallel, intermediate, f"{prefix} intermediate size")
        gate_up = weights.linear(
            [f"{prefix}.{gate}", f"{prefix}.{up}"], hidden, [intermediate, intermediate], shards=[channels, channels]
        )
        return cls(weights.ops, gate_up, weights.row_parallel_linear(f"{prefix}.{down}", intermediate, hidden, reduce))

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        return self.down(self.ops.silu_and_mul(self.gate_up(x)))


class RoutedExperts:
    """This rank's routed experts (fused_moe with its expert_map and the model's
    swiglu_limit), reached through the expert dispatch under expert parallelism: called
    with a rank's own tokens and their picks, it returns their routed output, complete
    under expert parallelism (`dispatch` set) and a tensor-parallel partial sum
    otherwise."""

    def __init__(
        self, ops: OpDispatcher, experts: ExpertWeights, num_experts: int, parallel: ParallelContext,
        swiglu_limit: float = 0.0,
    ) -> None:
        self.ops = ops
        self.experts = experts
        self.swiglu_limit = swiglu_limit
        self.dispatch = expert_dispatch(parallel, ops, num_experts, experts.w13.dtype)

    def __call__(self, x: torch.Tensor, topk_weights: torch.Tensor, topk_ids: torch.Tensor) -> torch.Tensor:
        if self.dispatch is None:
            return self.local(x, topk_weights, topk_ids)
        return self.dispatch(x, topk_weights, topk_ids, self.local)

    def local(self, x: torch.Tensor, topk_weights: torch.Tensor, topk_ids: torch.Tensor) -> torch.Tensor:
        """fused_moe over the experts on this rank (the picks its expert_map sends
        elsewhere contribute nothing)."""
        experts = self.experts
        return self.ops.fused_moe(
            x, experts.w13, experts.w2, topk_weights, topk_ids, experts.expert_map, experts.w13_scale,
            experts.w2_scale, swiglu_limit=self.swiglu_limit,
        )


class SparseMoE:
    """Routed experts through ops.moe_route and `RoutedExperts`, plus shared experts
    (DeepSeek) added on top. The router GEMM runs in the router weight's dtype (fp32 for
    DeepSeek, whose router Hugging Face keeps in fp32). Under tensor parallelism every
    rank routes alike and holds each expert's slice of the intermediate dim, and routed
    and shared partial outputs are summed over the TP ranks in one all_reduce. Under
    expert parallelism a rank holds whole experts of its own: it routes its own tokens,
    the expert dispatch carries them to the ranks with their experts and brings the
    summed output back, and only the shared experts' TP slices are all_reduced."""

    def __init__(
        self,
        ops: OpDispatcher,
        config: MoeConfig,
        router: torch.Tensor,
        experts: ExpertWeights,
        correction_bias: torch.Tensor | None = None,
        shared: GatedMLP | None = None,
        parallel: ParallelContext = ParallelContext.single(),
    ) -> None:
        self.ops = ops
        self.config = config
        self.router = router
        self.routed = RoutedExperts(ops, experts, config.num_experts, parallel)
        self.correction_bias = correction_bias
        self.shared = shared
        self.comm = parallel.tp_comm()

    @property
    def experts(self) -> ExpertWeights:
        """The routed experts' weights on this rank."""
        return self.routed.experts

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        cfg = self.config
        router_logits = F.linear(x.to(self.router.dtype), self.router)
        topk_weights, topk_ids = self.ops.moe_route(
            router_logits, self.correction_bias, top_k=cfg.top_k, scoring=cfg.scoring, renormalize=cfg.renormalize,
            n_group=cfg.n_group, topk_group=cfg.topk_group, routed_scaling_factor=cfg.routed_scaling_factor,
        )
        out = self.routed(x, topk_weights, topk_ids)
        if self.routed.dispatch is None:
            # Routed and shared outputs are both TP partial sums: one all_reduce for both.
            if self.shared is not None:
                out = out + self.shared(x)
            return out if self.comm is None else self.comm.all_reduce(out)
        if self.shared is None:
            return out
        shared = self.shared(x)
        return out + (shared if self.comm is None else self.comm.all_reduce(shared))
