"""Feed-forward blocks: the gated (SwiGLU) MLP and the routed mixture of experts."""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from contextlib import contextmanager

import torch
import torch.nn.functional as F

from ....op_contracts import OpDispatcher
from ...distributed import ParallelContext
from ...distributed.expert_dispatch import expert_dispatch
from ...distributed.sharding import split_evenly
from ...model_loader.model_config import MoeConfig
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
        self.num_experts = num_experts
        self.dispatch = expert_dispatch(parallel, ops, num_experts, experts.w13.dtype)
        #: profile_run's routing (see `worst_case_expert_load`).
        self.worst_case_load = False

    def __call__(self, x: torch.Tensor, topk_weights: torch.Tensor, topk_ids: torch.Tensor) -> torch.Tensor:
        if self.dispatch is None:
            return self.local(x, topk_weights, topk_ids)
        return self.dispatch(x, topk_weights, topk_ids, self.local)

    def local(self, x: torch.Tensor, topk_weights: torch.Tensor, topk_ids: torch.Tensor) -> torch.Tensor:
        """fused_moe over the experts on this rank (the picks its expert_map sends
        elsewhere contribute nothing). Under `worst_case_load` the picks that reach this
        rank are replaced by `worst_case_ids`, after any dispatch, so the rows fused_moe
        takes here are the most this rank's experts can get."""
        experts = self.experts
        if self.worst_case_load:
            topk_ids = worst_case_ids(topk_ids, self.num_experts, experts.expert_map)
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


def worst_case_ids(topk_ids: torch.Tensor, num_experts: int, expert_map: torch.Tensor | None) -> torch.Tensor:
    """profile_run's routing, in place of the router's picks (same shape and dtype):
    every token picks as many of this rank's experts as top_k allows, turn about so each
    of them gets tokens, and the rest of its picks elsewhere. An expert-parallel rank's
    expert GEMMs then take the most rows they ever can (every token of the batch, as
    when the router sends a whole batch to one rank), which a random profile batch
    would not give: its tokens route alike and may miss this rank's experts altogether."""
    device = topk_ids.device
    here = (torch.arange(num_experts, device=device) if expert_map is None
            else torch.nonzero(expert_map >= 0).flatten())
    elsewhere = torch.ones(num_experts, dtype=torch.bool, device=device)
    elsewhere[here] = False
    order = torch.cat([here, torch.nonzero(elsewhere).flatten()])
    tokens, top_k = topk_ids.shape
    local = here.numel()
    pick = torch.arange(top_k, device=device)[None, :]
    turn = (torch.arange(tokens, device=device)[:, None] + pick) % local
    ids = torch.where(pick < local, order[turn], order[pick.expand(tokens, -1)])
    return ids.to(topk_ids.dtype)


@contextmanager
def worst_case_expert_load(blocks: Iterable[RoutedExperts]) -> Iterator[None]:
    """Within the block, `blocks` route by `worst_case_ids` (profile_run)."""
    blocks = list(blocks)
    for block in blocks:
        block.worst_case_load = True
    try:
        yield
    finally:
        for block in blocks:
            block.worst_case_load = False
