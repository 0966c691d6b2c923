"""Expert parallel's token exchange (core/distributed/expert_dispatch.py) on 2 gloo
ranks: both strategies, with the ranks holding different numbers of tokens (0 and 1
included, as data-parallel ranks do) or the same tokens (a TP group, each rank sourcing
its share), against the reference backend's fused_moe over all tokens in one process;
fp8 on the all_to_all wire: bit-exact transport, results within fp8's quantisation of
the activations; the strategy knob and the communicator's dtype contract."""

from __future__ import annotations

import zlib
from pathlib import Path
from typing import Any

import pytest
import torch
import torch.distributed as dist

from accord.backends import get_backend
from accord.backends.communicator import COLLECTIVES, GLOO, CollectiveSupport, TorchCommunicator
from accord.conformance.ranks import spawn_ranks
from accord.core.distributed import ParallelContext
from accord.core.distributed.expert_dispatch import (
    DISPATCH_ENV,
    AllGatherDispatch,
    AllToAllDispatch,
    ExpertDispatch,
    expert_dispatch,
    strategy_for,
)
from accord.op_contracts import ContractError, OpDispatcher

EXPERTS, HIDDEN, INTERMEDIATE, TOP_K = 8, 32, 16, 3
FP8 = torch.float8_e4m3fn
#: (name, tp_size, dp_size, tokens each DP rank holds): uneven DP counts with 0 and 1,
#: and a TP group (one DP rank) whose shares are uneven (1 token: one rank sources none).
LAYOUTS = [
    ("dp2-0-and-5", 1, 2, (0, 5)),
    ("dp2-1-and-4", 1, 2, (1, 4)),
    ("dp2-7-and-0", 1, 2, (7, 0)),
    ("dp2-0-and-0", 1, 2, (0, 0)),
    ("tp2-5", 2, 1, (5,)),
    ("tp2-1", 2, 1, (1,)),
    ("tp2-0", 2, 1, (0,)),
]
STRATEGIES = ["allgather", "all_to_all", "all_to_all_fp8"]


def _experts() -> tuple[torch.Tensor, torch.Tensor]:
    generator = torch.Generator().manual_seed(7)
    w13 = torch.randn(EXPERTS, 2 * INTERMEDIATE, HIDDEN, generator=generator) * HIDDEN**-0.5
    w2 = torch.randn(EXPERTS, HIDDEN, INTERMEDIATE, generator=generator) * INTERMEDIATE**-0.5
    return w13, w2


def _tokens(layout: str, dp_rank: int, count: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """A DP rank's tokens and distinct top-k picks (int32 ids), the same on every rank."""
    # crc32, not hash(): every rank derives the same tokens in its own process.
    generator = torch.Generator().manual_seed(zlib.crc32(f"{layout}/{dp_rank}".encode()))
    x = torch.randn(count, HIDDEN, generator=generator)
    ids = torch.rand(count, EXPERTS, generator=generator).argsort(dim=1)[:, :TOP_K].to(torch.int32)
    weights = torch.rand(count, TOP_K, generator=generator).softmax(dim=1)
    return x, weights, ids


def _dispatch(strategy: str, comm: TorchCommunicator, tp_size: int, ops: OpDispatcher) -> ExpertDispatch:
    """On 2 ranks a TP group of 2 is the whole world (one DP rank)."""
    tp = comm if tp_size > 1 else None
    tp_rank = comm.rank % tp_size
    if strategy == "allgather":
        return AllGatherDispatch(comm, tp, tp_rank)
    wire = FP8 if strategy == "all_to_all_fp8" else None
    return AllToAllDispatch(comm, tp, tp_rank, EXPERTS, ops, wire)


def exchange_rank(comm: TorchCommunicator) -> dict[str, Any]:
    """Runs in each rank: every layout under every strategy, with this rank's half of
    the experts; plus fp8 payloads through all_to_all."""
    ops = OpDispatcher(get_backend("cpu"))
    w13, w2 = _experts()
    per_rank = EXPERTS // comm.world_size
    local = slice(comm.rank * per_rank, (comm.rank + 1) * per_rank)
    expert_map = torch.full((EXPERTS,), -1, dtype=torch.int32)
    expert_map[local] = torch.arange(per_rank, dtype=torch.int32)
    w13_local, w2_local = w13[local].contiguous(), w2[local].contiguous()

    def run_experts(x: torch.Tensor, weights: torch.Tensor, ids: torch.Tensor) -> torch.Tensor:
        return ops.fused_moe(x, w13_local, w2_local, weights, ids, expert_map, None, None)

    outputs = {}
    for strategy in STRATEGIES:
        for layout, tp_size, _, counts in LAYOUTS:
            dp_rank = comm.rank // tp_size
            x, weights, ids = _tokens(layout, dp_rank, counts[dp_rank])
            dispatch = _dispatch(strategy, comm, tp_size, ops)
            outputs[strategy, layout] = dispatch(x, weights, ids, run_experts)
    # Every finite fp8 code, sent half to each rank: the bytes must arrive unchanged.
    codes = torch.arange(256, dtype=torch.uint8).view(FP8)
    codes = codes[~codes.float().isnan()]
    half = codes.shape[0] // 2
    moved = comm.all_to_all(codes, [half, codes.shape[0] - half], [half, codes.shape[0] - half])
    scales = torch.rand(codes.shape[0], 1, dtype=torch.float32)
    moved_scales = comm.all_to_all(scales, [half, codes.shape[0] - half], [half, codes.shape[0] - half])
    dist.barrier()
    # fp8 tensors are returned as their bytes (torch cannot unpickle an fp8 view).
    return {
        "outputs": outputs, "fp8_sent": codes.view(torch.uint8).clone(), "fp8_moved": moved.view(torch.uint8).clone(),
        "scales": scales, "scales_moved": moved_scales,
    }


@pytest.fixture(scope="module")
def ranks() -> list[dict[str, Any]]:
    return spawn_ranks(exchange_rank)


def _reference(layout: str, counts: tuple[int, ...], fp8_activations: bool) -> list[torch.Tensor]:
    """The reference backend's fused_moe over every DP rank's tokens at once, all experts
    in one process; split back per DP rank."""
    ops = OpDispatcher(get_backend("reference"))
    w13, w2 = _experts()
    parts = [_tokens(layout, d, n) for d, n in enumerate(counts)]
    x = torch.cat([p[0] for p in parts])
    if fp8_activations:
        # Per-token fp8 as the wire carries it, computed independently of the code under test.
        scale = x.abs().amax(dim=1, keepdim=True).clamp(min=1e-10) / torch.finfo(FP8).max
        x = (x / scale).to(FP8).float() * scale
    weights, ids = torch.cat([p[1] for p in parts]), torch.cat([p[2] for p in parts])
    out = ops.fused_moe(x, w13, w2, weights, ids, None, None, None)
    return list(out.split(list(counts)))


@pytest.mark.slow
@pytest.mark.parametrize("strategy", STRATEGIES)
@pytest.mark.parametrize(("layout", "tp_size", "dp_size", "counts"), LAYOUTS, ids=[lay[0] for lay in LAYOUTS])
def test_each_rank_gets_the_full_moe_output_of_its_own_tokens(
    ranks: list[dict[str, Any]], strategy: str, layout: str, tp_size: int, dp_size: int, counts: tuple[int, ...]
) -> None:
    expected = _reference(layout, counts, fp8_activations=strategy == "all_to_all_fp8")
    for rank, result in enumerate(ranks):
        got = result["outputs"][strategy, layout]
        want = expected[rank // tp_size]
        assert got.shape == want.shape and got.dtype == torch.float32
        torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)


@pytest.mark.slow
def test_fp8_activations_stay_within_fp8_quantisation_of_the_exact_result(ranks: list[dict[str, Any]]) -> None:
    layout, _, _, counts = LAYOUTS[1]
    exact = _reference(layout, counts, fp8_activations=False)
    for rank, result in enumerate(ranks):
        got, want = result["outputs"]["all_to_all_fp8", layout], exact[rank]
        # e4m3 keeps 3 mantissa bits: each activation within 2^-4 relative, so the
        # output within a few percent of its scale; bf16-exactness is not expected.
        assert (got - want).abs().max() <= 0.08 * want.abs().max()
        assert not torch.equal(got, want)  # the quantisation really happened


def test_fp8_codes_and_fp32_scales_cross_all_to_all_bit_exactly(ranks: list[dict[str, Any]]) -> None:
    half = ranks[0]["fp8_sent"].shape[0] // 2
    for rank, result in enumerate(ranks):
        sent_here = [r["fp8_sent"][:half] if rank == 0 else r["fp8_sent"][half:] for r in ranks]
        assert torch.equal(result["fp8_moved"], torch.cat(sent_here))
        scales_here = [r["scales"][:half] if rank == 0 else r["scales"][half:] for r in ranks]
        assert torch.equal(result["scales_moved"], torch.cat(scales_here))


def test_the_all_to_all_contract_carries_fp8_and_fp32_scales_and_refuses_what_it_does_not() -> None:
    assert GLOO.carries("all_to_all", FP8) and GLOO.carries("all_to_all", torch.float32)
    assert not GLOO.carries("all_to_all", torch.complex64)
    no_fp8 = CollectiveSupport("strict", {c: frozenset({torch.float32, torch.int64}) for c in COLLECTIVES})
    assert not no_fp8.carries("all_to_all", FP8)
    with pytest.raises(ContractError) as refusal:
        no_fp8.plan("all_to_all", FP8)
    assert (refusal.value.op, refusal.value.arg) == ("collective.all_to_all", "tensor")


class _Named:
    """Just enough of a communicator for choosing a strategy and a wire format."""

    def __init__(self, name: str, support: CollectiveSupport = GLOO) -> None:
        self.name, self.support, self.world_size, self.rank = name, support, 2, 0

    def carries(self, collective: str, dtype: torch.dtype) -> bool:
        return self.support.carries(collective, dtype)


def test_strategy_defaults_per_communicator_and_the_env_var_overrides(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(DISPATCH_ENV, raising=False)
    assert strategy_for(_Named("gloo")) == "allgather"
    assert strategy_for(_Named("nccl")) == "all_to_all"
    assert strategy_for(_Named("hccl")) == "all_to_all"
    monkeypatch.setenv(DISPATCH_ENV, "all_to_all")
    assert strategy_for(_Named("gloo")) == "all_to_all"
    monkeypatch.setenv(DISPATCH_ENV, "allgather")
    assert strategy_for(_Named("nccl")) == "allgather"
    ops = OpDispatcher(get_backend("cpu"))
    for dp_size, expected in ((1, type(None)), (2, AllGatherDispatch)):
        # One DP rank: every rank holds every token, the layer's TP all_reduce suffices.
        parallel = ParallelContext(
            rank=0, world_size=2, tp_rank=0, tp_size=2 // dp_size, expert_parallel=True, dp_size=dp_size,
            communicator=_Named("gloo"), ep_communicator=_Named("gloo"),  # type: ignore[arg-type]
        )
        assert isinstance(expert_dispatch(parallel, ops, EXPERTS, torch.float32), expected)
    monkeypatch.setenv(DISPATCH_ENV, "pplx")
    with pytest.raises(ValueError, match="ACCORD_EP_DISPATCH='pplx': choose one of"):
        strategy_for(_Named("gloo"))


@pytest.mark.parametrize(
    ("experts_dtype", "support", "wire"),
    [(FP8, GLOO, FP8), (torch.bfloat16, GLOO, None),
     (FP8, CollectiveSupport("strict", {c: frozenset({torch.float32}) for c in COLLECTIVES}), None)],
)
def test_fp8_travels_only_for_fp8_experts_over_a_communicator_that_carries_it(
    monkeypatch: pytest.MonkeyPatch, experts_dtype: torch.dtype, support: CollectiveSupport, wire: torch.dtype | None
) -> None:
    monkeypatch.setenv(DISPATCH_ENV, "all_to_all")
    comm = _Named("nccl", support)
    parallel = ParallelContext(
        rank=0, world_size=2, tp_rank=0, tp_size=2, communicator=comm, expert_parallel=True,  # type: ignore[arg-type]
        ep_communicator=comm,  # type: ignore[arg-type]
    )
    dispatch = expert_dispatch(parallel, OpDispatcher(get_backend("cpu")), EXPERTS, experts_dtype)
    assert isinstance(dispatch, AllToAllDispatch) and dispatch.wire_fp8 == wire
    assert expert_dispatch(ParallelContext.single(), OpDispatcher(get_backend("cpu")), EXPERTS, FP8) is None


#: DeepSeek-V4 under EP over two DP ranks (its graph has no tensor-parallel split yet):
#: each rank's own token ids, 3 on one rank and 1 on the other.
V4_TOKENS = ([5, 17, 300], [42])


def v4_rank(comm: TorchCommunicator, model_dir: str) -> dict[tuple[str, int], torch.Tensor]:
    """Loads the tiny V4 with this rank's half of the experts under each strategy and
    runs every MoE layer on this rank's tokens (hash layers route by their ids)."""
    import os

    from accord.core.model_loader.load import load_model

    parallel = ParallelContext(
        rank=comm.rank, world_size=2, tp_rank=0, tp_size=1, expert_parallel=True, dp_rank=comm.rank, dp_size=2,
        ep_communicator=comm,  # type: ignore[arg-type]
    )
    ids = torch.tensor(V4_TOKENS[comm.rank])
    x = torch.randn(ids.shape[0], 64, generator=torch.Generator().manual_seed(comm.rank))
    outputs = {}
    for strategy in ("allgather", "all_to_all"):
        os.environ[DISPATCH_ENV] = strategy
        model = load_model(model_dir, OpDispatcher(get_backend("cpu")), dtype=torch.float32, parallel=parallel).model
        for index, layer in enumerate(model.layers):
            assert layer.moe.routed.dispatch is not None
            outputs[strategy, index] = layer.moe(x, ids)
    return outputs


@pytest.mark.slow
def test_deepseek_v4_moe_layers_under_ep_match_one_rank_with_every_expert(tmp_path: Path) -> None:
    from deepseek_v4_models import build_v4_dir

    from accord.core.model_loader.load import load_model

    model_dir = build_v4_dir(tmp_path / "v4")
    ranks = spawn_ranks(v4_rank, str(model_dir))
    whole = load_model(model_dir, OpDispatcher(get_backend("reference")), dtype=torch.float32).model
    ids = torch.tensor(V4_TOKENS[0] + V4_TOKENS[1])
    x = torch.cat(
        [torch.randn(len(t), 64, generator=torch.Generator().manual_seed(r)) for r, t in enumerate(V4_TOKENS)]
    )
    assert any(layer.moe.hash_table is not None for layer in whole.layers)
    for index, layer in enumerate(whole.layers):
        expected = layer.moe(x, ids).split([len(t) for t in V4_TOKENS])
        for rank, outputs in enumerate(ranks):
            for strategy in ("allgather", "all_to_all"):
                torch.testing.assert_close(outputs[strategy, index], expected[rank], rtol=1e-5, atol=1e-5)


@pytest.mark.slow
@pytest.mark.parametrize("strategy", ["allgather", "all_to_all"])
def test_deepseek_v4_tp2_ep_greedy_equals_transformers(
    strategy: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """V4 through `LLM` at TP=2 + EP (its MoE split, attention replicated), hash layers
    included, against transformers' prefix-only greedy decoding."""
    from deepseek_v4_models import build_v4_dir, prefix_only_greedy
    from test_deepseek_v4 import ENGINE_ARGS

    from accord import LLM
    from accord.core.sampling_params import SamplingParams

    monkeypatch.setenv(DISPATCH_ENV, strategy)
    model_dir = build_v4_dir(tmp_path / "v4")
    generator = torch.Generator().manual_seed(5)
    prompts = [torch.randint(3, 200, (n,), generator=generator).tolist() for n in (21, 9)]
    llm = LLM(
        str(model_dir), tensor_parallel_size=2, enable_expert_parallel=True, distributed_executor_backend="mp",
        **ENGINE_ARGS,
    )
    try:
        params = SamplingParams(max_tokens=4, temperature=0.0, ignore_eos=True)
        outputs = llm.generate([{"prompt_token_ids": p} for p in prompts], params, use_tqdm=False)
    finally:
        llm.llm_engine.shutdown()
    assert [list(o.outputs[0].token_ids) for o in outputs] == prefix_only_greedy(model_dir, prompts, 4)


@pytest.mark.slow
@pytest.mark.parametrize("architecture", ["mixtral", "deepseek_v3"])
def test_dp2_ep_greedy_equals_transformers_through_all_to_all(
    architecture: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The data-parallel test (requests split over two replicas, one idle for part of
    the run so the dummy batch is exchanged too) with tokens moved by all_to_all instead
    of gloo's default allgather."""
    from test_data_parallel import test_dp2_greedy_equals_transformers_with_requests_split_and_a_replica_idle as dp2

    monkeypatch.setenv(DISPATCH_ENV, "all_to_all")
    dp2(f"{architecture}-ep", architecture, True, tmp_path)
