"""Expert parallel's token exchange: how the tokens a rank holds reach the ranks holding
their routed experts, and how the experts' outputs come back in the tokens' order.

Under expert parallelism (EP size = TP x DP) each rank holds a contiguous (possibly uneven:
the first E % EP ranks one more, as vLLM places them) range of whole
experts (`WeightLoader.experts`), and the ranks of the EP group hold different tokens:
each data-parallel rank its own batch (a 1-token dummy batch when idle), the TP ranks of
one DP rank the same tokens. Routing runs before the exchange, on the rank that holds the
token, so routing by token id (DeepSeek-V4's hash layers) always sees the token's own id;
the picks (`topk_weights`, `topk_ids`) travel with the activations.

One mechanism, two strategies (`ExpertDispatch`):

1. TP ranks of a DP rank hold the same tokens, so each sources only its 1/tp share
   (`Shard` chunk `tp_rank`): no token enters the exchange tp_size times.
2. The strategy moves the shares to the ranks with their experts, runs `run_experts`
   (fused_moe with this rank's expert_map, which skips the picks held elsewhere) there,
   and brings each share's summed output back to its source rank:
   - `allgather`: every rank gathers every share of the EP group (uneven sizes),
     computes its experts' part for all of them, and a reduce-scatter with the same
     uneven sizes hands each rank the sum for its share (vLLM's naive path);
   - `all_to_all`: each token goes once to each rank that owns one of its picks (picks
     for one rank share the row), the partial outputs come back the same way and are
     summed at the source. Activations travel as fp8 with fp32 per-token scales when
     the experts are fp8 and the communicator carries fp8 (the all_to_all dtype
     contract in backends/communicator.py), else in the model dtype.
3. An all-gather within the TP group reassembles the DP rank's tokens.

With one DP rank (EP = TP) every rank already holds every token, so the allgather
strategy degenerates to no exchange at all: fused_moe over all tokens with the
expert_map and the layer's TP all_reduce (routed and shared together), which is the
reduce-scatter and TP re-gather fused into one collective (`expert_dispatch` returns
None). all_to_all still pays off there at large EP (it sends each token only where its
experts are).

Token counts differ between DP ranks and change every step, so the allgather strategy
learns them with one tiny all_gather of an int64 count per MoE layer call: per call
rather than per step because the exchange sees no step boundary (nothing ties it to the
runner), and one latency-bound collective beside the two bandwidth-bound ones is cheap.
The all_to_all strategy needs per-layer counts anyway (routing decides them), exchanged
by a tiny all_to_all of one count per peer.

Default per communicator (`ACCORD_EP_DISPATCH=allgather|all_to_all` overrides, vLLM's
`--all2all-backend`): gloo (CPU) uses `allgather`: a CPU deployment runs few ranks,
where all_to_all saves little (at EP 2 a DeepSeek-V3 token moves the same bytes either
way), while allgather needs no exchange at all with one DP rank, no host sync on split
sizes, no gather/scatter bookkeeping, and gloo's all_to_all is pairwise send/receive.
NCCL, RCCL and HCCL use `all_to_all`: with many ranks a token reaches only the few
ranks its top-k experts live on instead of all EP-1 of them (DeepSeek-V3 at EP 16:
about 5.5 ranks instead of 15), and fp8 cuts dispatch bytes by almost half
(benchmarks/ep_comm_volume.py gives the numbers).
"""

from __future__ import annotations

import os
from abc import ABC, abstractmethod
from typing import Callable

import torch

from ...op_contracts import FP8_DTYPES, OpDispatcher
from . import ParallelContext
from .communicator import Communicator
from .sharding import Shard, expert_owners

#: The environment variable that picks the strategy (unset: the communicator's default).
DISPATCH_ENV = "ACCORD_EP_DISPATCH"
ALLGATHER, ALL_TO_ALL = "allgather", "all_to_all"
STRATEGIES = (ALLGATHER, ALL_TO_ALL)
#: Communicators that default to all_to_all; any other (gloo) defaults to allgather.
ALL_TO_ALL_BY_DEFAULT = frozenset({"nccl", "rccl", "hccl"})

#: (activations [N, H], topk_weights [N, K], topk_ids [N, K]) -> this rank's experts'
#: weighted sum for each row [N, H] (zero for rows none of whose picks are here).
RunExperts = Callable[[torch.Tensor, torch.Tensor, torch.Tensor], torch.Tensor]


class ExpertDispatch(ABC):
    """Dispatch a rank's tokens to the ranks holding their experts, run the experts
    there, and combine the outputs back in the tokens' order. A subclass is a strategy:
    it exchanges this TP rank's share of the tokens (`_exchange`)."""

    def __init__(self, ep: Communicator, tp: Communicator | None, tp_rank: int) -> None:
        self.ep = ep
        self.tp = tp
        self.tp_rank = tp_rank
        self.tp_size = 1 if tp is None else tp.world_size

    def __call__(
        self, x: torch.Tensor, topk_weights: torch.Tensor, topk_ids: torch.Tensor, run_experts: RunExperts
    ) -> torch.Tensor:
        """The routed experts' output [T, H] for the tokens `x` [T, H] this rank holds,
        routed to `topk_ids` [T, K] with `topk_weights` [T, K] (every rank of the EP
        group calls it, each with its own tokens; T may be 0)."""
        share = Shard(0, self.tp_rank, self.tp_size)
        start, stop = share.bounds(x.shape[0])
        out = self._exchange(x[start:stop], topk_weights[start:stop], topk_ids[start:stop], run_experts, x.shape[0])
        return out if self.tp is None else self.tp.all_gather(out, sizes=share.extents(x.shape[0]))

    @abstractmethod
    def _exchange(
        self, x: torch.Tensor, topk_weights: torch.Tensor, topk_ids: torch.Tensor, run_experts: RunExperts,
        dp_tokens: int,
    ) -> torch.Tensor:
        """The summed expert output for this rank's share `x` (its DP rank holds
        `dp_tokens` tokens in all)."""


class AllGatherDispatch(ExpertDispatch):
    """Every rank gathers every share of the EP group, runs its experts on all of them,
    and a reduce-scatter returns each rank the sum for its own share."""

    def _exchange(
        self, x: torch.Tensor, topk_weights: torch.Tensor, topk_ids: torch.Tensor, run_experts: RunExperts,
        dp_tokens: int,
    ) -> torch.Tensor:
        sizes = self._share_sizes(dp_tokens, x.device)
        gathered = self.ep.all_gather(x, sizes=sizes)
        routing = self.ep.all_gather(pack_routing(topk_weights, topk_ids), sizes=sizes)
        weights, ids = unpack_routing(routing, topk_ids.dtype)
        return self.ep.reduce_scatter(run_experts(gathered, weights, ids), sizes=sizes)

    def _share_sizes(self, dp_tokens: int, device: torch.device) -> list[int]:
        """Every EP rank's share size, in EP rank order (DP-major, so TP rank = r % tp)."""
        per_rank = self.ep.all_gather(torch.tensor([dp_tokens], dtype=torch.int64, device=device)).tolist()
        return [Shard(0, r % self.tp_size, self.tp_size).extent(t) for r, t in enumerate(per_rank)]


class AllToAllDispatch(ExpertDispatch):
    """Each token goes once to each rank owning one of its picks (all_to_all), the
    partial outputs return the same way and are summed at the source. `wire_fp8` (an
    fp8 dtype, or None for the model dtype) is the activations' format on the wire,
    quantised per token through `ops.quantize_fp8` with fp32 scales."""

    def __init__(
        self, ep: Communicator, tp: Communicator | None, tp_rank: int, num_experts: int, ops: OpDispatcher,
        wire_fp8: torch.dtype | None = None,
    ) -> None:
        super().__init__(ep, tp, tp_rank)
        self.owners = expert_owners(num_experts, ep.world_size)
        self.ops = ops
        self.wire_fp8 = wire_fp8

    def _exchange(
        self, x: torch.Tensor, topk_weights: torch.Tensor, topk_ids: torch.Tensor, run_experts: RunExperts,
        dp_tokens: int,
    ) -> torch.Tensor:
        ranks = self.ep.world_size
        # Experts are contiguous, possibly uneven ranges (sharding.expert_range).
        owners = self.owners.to(topk_ids.device)[topk_ids.long()]
        hits = torch.zeros((x.shape[0], ranks), dtype=torch.bool, device=x.device)
        hits.scatter_(1, owners, True)
        # Rows to send, grouped by destination rank (then token order).
        dest, tokens = hits.t().nonzero(as_tuple=True)
        send = torch.bincount(dest, minlength=ranks)
        recv = self.ep.all_to_all(send, [1] * ranks, [1] * ranks)
        send_sizes, recv_sizes = send.tolist(), recv.tolist()
        activations, meta = self._encode(x[tokens], pack_routing(topk_weights[tokens], topk_ids[tokens]))
        activations = self.ep.all_to_all(activations, recv_sizes, send_sizes)
        meta = self.ep.all_to_all(meta, recv_sizes, send_sizes)
        received, routing = self._decode(activations, meta, x.dtype)
        weights, ids = unpack_routing(routing, topk_ids.dtype)
        partial = self.ep.all_to_all(run_experts(received, weights, ids), send_sizes, recv_sizes)
        out = torch.zeros(x.shape, dtype=torch.float32, device=x.device)
        return out.index_add_(0, tokens, partial.float()).to(x.dtype)

    def _encode(self, x: torch.Tensor, routing: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """(activations on the wire, routing with the fp32 scales appended when fp8)."""
        if self.wire_fp8 is None:
            return x, routing
        q, scales = self.ops.quantize_fp8(x, mode="per_token", fp8_dtype=self.wire_fp8)
        return q, torch.cat([routing, scales], dim=1)

    def _decode(
        self, activations: torch.Tensor, meta: torch.Tensor, dtype: torch.dtype
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """(activations in the model dtype, the routing part of `meta`)."""
        if self.wire_fp8 is None:
            return activations, meta
        return (activations.float() * meta[:, -1:]).to(dtype), meta[:, :-1]


def pack_routing(topk_weights: torch.Tensor, topk_ids: torch.Tensor) -> torch.Tensor:
    """Weights and ids [N, K] as one fp32 tensor [N, 2K] (one collective, not two):
    expert ids are below 2^24, which fp32 holds exactly."""
    return torch.cat([topk_weights.float(), topk_ids.float()], dim=1)


def unpack_routing(packed: torch.Tensor, ids_dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
    """`pack_routing`'s inverse: (fp32 weights, ids at `ids_dtype`)."""
    k = packed.shape[1] // 2
    return packed[:, :k].contiguous(), packed[:, k:].to(ids_dtype)


def strategy_for(comm: Communicator) -> str:
    """The strategy `ACCORD_EP_DISPATCH` names, else the communicator's default."""
    chosen = os.environ.get(DISPATCH_ENV, "")
    if not chosen:
        return ALL_TO_ALL if comm.name in ALL_TO_ALL_BY_DEFAULT else ALLGATHER
    if chosen not in STRATEGIES:
        raise ValueError(f"{DISPATCH_ENV}={chosen!r}: choose one of {list(STRATEGIES)}")
    return chosen


def expert_dispatch(
    parallel: ParallelContext, ops: OpDispatcher, num_experts: int, experts_dtype: torch.dtype
) -> ExpertDispatch | None:
    """The exchange a routed-expert layer uses, or None when it needs none: no expert
    parallelism, or the allgather strategy with one DP rank (see below). Activations
    travel as fp8 only when the experts are fp8 already (a quantised checkpoint, as vLLM
    quantises dispatch only under an fp8 quant config) and the communicator's all_to_all
    carries fp8."""
    ep = parallel.ep_comm()
    if ep is None:
        return None
    tp = parallel.tp_comm()
    if strategy_for(ep) == ALLGATHER:
        if parallel.dp_size == 1:
            # Every rank already holds every token: nothing to gather, and the layer's TP
            # all_reduce (routed and shared at once) is the reduce-scatter and re-gather
            # in one collective, moving fewer bytes than sourcing shares would.
            return None
        return AllGatherDispatch(ep, tp, parallel.tp_rank)
    fp8 = ops.backend.fp8_dtype()  # type: ignore[attr-defined]
    wire_fp8 = fp8 if experts_dtype in FP8_DTYPES and ep.carries("all_to_all", fp8) else None
    return AllToAllDispatch(ep, tp, parallel.tp_rank, num_experts, ops, wire_fp8)
