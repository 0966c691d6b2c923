"""Expert parallel's communication volume: bytes each strategy of the token exchange
(core/distributed/expert_dispatch.py) moves per token per MoE layer, counted and
computed.

    PYTHONPATH=. python benchmarks/ep_comm_volume.py [--tokens 32]

Counted: every rank of an EP group runs the real `ExpertDispatch` in its own thread of
this process over an in-memory communicator, wrapped by a counting communicator that
adds up the bytes each collective sends from a rank to its peers: an all_gather sends
the rank's rows to each of the others, a reduce_scatter the other ranks' slices of its
partial sums, an all_to_all the rows addressed to other ranks (payload only: the gloo
path's padding of uneven gathers is not counted). Per token = all ranks' bytes / the
tokens of the group. The experts are not run (bytes do not depend on them). Routing is
the model's (grouped sigmoid top-k with a correction bias) on random router logits, so
experts are used about uniformly; skewed real traffic changes the all_to_all figures.

Computed (H hidden, b bytes per activation, K top-k, N EP ranks, r the mean number of
other ranks a token's picks land on, measured from the same routing):
    allgather:  (N-1) * (H*b + 8K)            dispatch: every rank gets every token
              + (N-1) * H*b                   combine: reduce-scatter of partial sums
    all_to_all: r * (H*w + 8K [+ 4 scale])    dispatch: once per remote owner rank
              + r * H*b                       combine: the partial sums come back
with w = 1 for fp8 on the wire (plus a 4-byte fp32 scale), w = b otherwise; 8K are the
fp32 routing weights and ids. The all_to_all's per-layer split-size exchange and the
allgather's count gather (8 bytes per peer per layer) are left out of the formula.

Layouts are DP x EP with TP 1 (DeepSeek's DP-attention + EP deployment: every rank holds
its own tokens), plus the tiny model at DP 2 x TP 2 (EP 4), where each token enters the
exchange once although both TP ranks of its DP rank hold it (the TP re-gather is
counted). With one DP rank (EP = TP) the allgather strategy exchanges nothing: the TP
all_reduce moves 2(N-1)/N * H*b per token per rank instead.
"""

from __future__ import annotations

import argparse
import threading
from collections import Counter
from dataclasses import dataclass
from math import comb
from typing import Any, Sequence

import torch

from accord.backends import get_backend
from accord.core.distributed.expert_dispatch import AllGatherDispatch, AllToAllDispatch, ExpertDispatch
from accord.core.distributed.sharding import Shard
from accord.op_contracts import OpDispatcher


@dataclass(frozen=True)
class Shape:
    """An MoE layer's exchange-relevant shape and routing."""

    name: str
    hidden: int
    experts: int
    top_k: int
    n_group: int
    topk_group: int


DEEPSEEK_V3 = Shape("DeepSeek-V3", 7168, 256, 8, 8, 4)
#: tests/models/tiny_models.py's deepseek_v3.
TINY = Shape("tiny deepseek_v3", 64, 8, 2, 4, 2)


class ThreadGroup:
    """The ranks of an in-process group: each collective swaps every rank's value."""

    def __init__(self, size: int) -> None:
        self.size = size
        self.slots: list[Any] = [None] * size
        self.barrier = threading.Barrier(size)

    def exchange(self, rank: int, value: Any) -> list[Any]:
        self.slots[rank] = value
        self.barrier.wait()
        values = list(self.slots)
        self.barrier.wait()
        return values


class CountingCommunicator:
    """One rank of a ThreadGroup with the Communicator surface, counting the bytes it
    sends to its peers per collective."""

    name = "threads"

    def __init__(self, group: ThreadGroup, rank: int) -> None:
        self.group, self.rank, self.world_size = group, rank, group.size
        self.sent: Counter[str] = Counter()

    def all_reduce(self, x: torch.Tensor) -> torch.Tensor:
        self.sent["all_reduce"] += 2 * (self.world_size - 1) * x.nbytes // self.world_size  # ring
        return torch.stack(self.group.exchange(self.rank, x)).sum(0)

    def all_gather(self, x: torch.Tensor, dim: int = 0, sizes: Sequence[int] | None = None) -> torch.Tensor:
        self.sent["all_gather"] += (self.world_size - 1) * x.nbytes
        return torch.cat(self.group.exchange(self.rank, x), dim)

    def reduce_scatter(self, x: torch.Tensor, dim: int = 0, sizes: Sequence[int] | None = None) -> torch.Tensor:
        extents = list(sizes) if sizes is not None else [x.shape[dim] // self.world_size] * self.world_size
        self.sent["reduce_scatter"] += x.nbytes - x.split(extents, dim)[self.rank].nbytes
        total = torch.stack(self.group.exchange(self.rank, x)).sum(0)
        return total.split(extents, dim)[self.rank]

    def all_to_all(
        self, x: torch.Tensor, output_split_sizes: Sequence[int], input_split_sizes: Sequence[int]
    ) -> torch.Tensor:
        pieces = x.split(list(input_split_sizes))
        self.sent["all_to_all"] += sum(p.nbytes for r, p in enumerate(pieces) if r != self.rank)
        received = self.group.exchange(self.rank, pieces)
        return torch.cat([received[src][self.rank] for src in range(self.world_size)])

    def carries(self, collective: str, dtype: torch.dtype) -> bool:
        return True


def route(ops: OpDispatcher, shape: Shape, tokens: int, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    """DeepSeek-V3's routing on random logits: grouped sigmoid top-k with a bias."""
    generator = torch.Generator().manual_seed(seed)
    logits = torch.randn(tokens, shape.experts, generator=generator)
    bias = torch.randn(shape.experts, generator=generator) * 0.1
    return ops.moe_route(
        logits, bias, top_k=shape.top_k, scoring="sigmoid", renormalize=True, n_group=shape.n_group,
        topk_group=shape.topk_group, routed_scaling_factor=2.5,
    )


def count(shape: Shape, ep: int, tp: int, tokens: int, strategy: str, dtype: torch.dtype) -> tuple[float, float]:
    """(bytes per token of the EP exchange, mean other ranks a token's picks reach)."""
    ops = OpDispatcher(get_backend("cpu"))
    group = ThreadGroup(ep)
    comms = [CountingCommunicator(group, r) for r in range(ep)]
    dp = ep // tp
    tp_groups = [ThreadGroup(tp) for _ in range(dp)]
    tp_comms = [CountingCommunicator(tp_groups[r // tp], r % tp) for r in range(ep)]
    inputs = []
    remote = 0.0
    for rank in range(ep):
        dp_rank = rank // tp
        weights, ids = route(ops, shape, tokens, seed=dp_rank)
        x = torch.randn(tokens, shape.hidden, generator=torch.Generator().manual_seed(dp_rank)).to(dtype)
        inputs.append((x, weights, ids))
        # The ranks other than this one that its share of the tokens reaches.
        start, stop = Shard(0, rank % tp, tp).bounds(tokens)
        owners = ids[start:stop].long() // (shape.experts // ep)
        hit = torch.zeros(stop - start, ep, dtype=torch.bool).scatter_(1, owners, True)
        hit[:, rank] = False
        remote += hit.sum().item()

    def dispatcher(comm: CountingCommunicator) -> ExpertDispatch:
        tp_comm = tp_comms[comm.rank] if tp > 1 else None
        if strategy == "allgather":
            return AllGatherDispatch(comm, tp_comm, comm.rank % tp)
        wire = torch.float8_e4m3fn if strategy == "all_to_all fp8" else None
        return AllToAllDispatch(comm, tp_comm, comm.rank % tp, shape.experts, ops, wire)

    def no_experts(x: torch.Tensor, weights: torch.Tensor, ids: torch.Tensor) -> torch.Tensor:
        return torch.zeros_like(x)

    def run(rank: int) -> None:
        x, weights, ids = inputs[rank]
        dispatcher(comms[rank])(x, weights, ids, no_experts)

    threads = [threading.Thread(target=run, args=(r,)) for r in range(ep)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    sent = sum(sum(c.sent.values()) for c in comms + tp_comms)
    return sent / (dp * tokens), remote / (dp * tokens)


def formula(shape: Shape, ep: int, tp: int, strategy: str, act_bytes: int, remote: float) -> float:
    """The module docstring's bytes per token, plus the TP group's re-gather of the
    outputs ((tp-1) * H*b) when TP > 1."""
    routing, regather = 8 * shape.top_k, (tp - 1) * shape.hidden * act_bytes
    if strategy == "allgather":
        return (ep - 1) * (2 * shape.hidden * act_bytes + routing) + regather
    wire = shape.hidden + 4 if strategy == "all_to_all fp8" else shape.hidden * act_bytes
    return remote * (wire + routing + shape.hidden * act_bytes) + regather


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--tokens", type=int, default=32, help="tokens each DP rank holds")
    args = parser.parse_args()
    torch.set_num_threads(1)
    dtype = torch.bfloat16
    act_bytes = torch.finfo(dtype).bits // 8
    rows = [(DEEPSEEK_V3, ep, 1) for ep in (2, 8, 16)] + [(TINY, 2, 1), (TINY, 4, 2)]
    print(f"bf16 activations, {args.tokens} tokens per DP rank; bytes sent per token per MoE layer")
    print(f"{'shape':18} {'EP':>3} {'TP':>3} {'strategy':15} {'counted':>10} {'formula':>10} {'remote r':>9}")
    for shape, ep, tp in rows:
        for strategy in ("allgather", "all_to_all", "all_to_all fp8"):
            counted, remote = count(shape, ep, tp, args.tokens, strategy, dtype)
            expected = formula(shape, ep, tp, strategy, act_bytes, remote)
            print(f"{shape.name:18} {ep:>3} {tp:>3} {strategy:15} {counted:>10.0f} {expected:>10.0f} {remote:>9.2f}")
    # What uniform random picks would give instead of grouped routing (the formula's r).
    for ep in (8, 16):
        per_rank = DEEPSEEK_V3.experts // ep
        miss = comb(DEEPSEEK_V3.experts - per_rank, DEEPSEEK_V3.top_k) / comb(DEEPSEEK_V3.experts, DEEPSEEK_V3.top_k)
        print(f"uniform top-{DEEPSEEK_V3.top_k} of {DEEPSEEK_V3.experts}, EP {ep}: r = {(ep - 1) * (1 - miss):.2f}")


if __name__ == "__main__":
    main()
