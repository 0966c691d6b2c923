"""Expert parallelism (`enable_expert_parallel`, EP size = TP size): each rank loads a
contiguous range of whole routed experts (uneven where they do not divide, as vLLM
places them) and nothing of the others', tokens reach their
experts through the expert dispatch (all-gather or all_to_all), fused_moe skips the
picks its expert_map sends elsewhere. End to end the greedy tokens equal transformers'
on every MoE architecture under each strategy."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import torch
from engine_models import hf_greedy
from processes import wait_until_gone
from safetensors.torch import load_file
from test_executor_mp import MAX_NEW_TOKENS, PRESSURE, generate, pressure_prompts
from test_shard_loading import NoCollectives, ReadLog
from test_tp_llm import save_with_tokenizer
from tiny_models import build_tiny_model

import accord.core.model_loader.hf_checkpoint as loader_module
from accord import LLM
from accord.backends import get_backend
from accord.core.distributed import ParallelContext
from accord.core.distributed.expert_dispatch import DISPATCH_ENV, STRATEGIES
from accord.core.distributed.sharding import expert_owners, expert_range
from accord.core.model_loader.load import load_model
from accord.core.models.layers.mlp import SparseMoE
from accord.op_contracts import OpDispatcher

#: A routed expert's tensor name and its expert id (shared experts do not match).
ROUTED = re.compile(r"\.experts\.(\d+)\.")

EP_RANK1_OF_2 = ParallelContext(
    rank=1, world_size=2, tp_rank=1, tp_size=2, communicator=NoCollectives(), expert_parallel=True
)


@pytest.mark.slow
@pytest.mark.parametrize("strategy", STRATEGIES)
@pytest.mark.parametrize("architecture", ["mixtral", "qwen3_moe", "deepseek_v3"])
def test_tp2_ep_mp_greedy_equals_transformers(
    architecture: str, strategy: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Under each token-exchange strategy (the spawned ranks inherit the variable)."""
    monkeypatch.setenv(DISPATCH_ENV, strategy)
    model_dir = save_with_tokenizer(tmp_path / architecture, architecture, {})
    assert_ep_greedy_equals_transformers(model_dir, tensor_parallel_size=2)


def assert_ep_greedy_equals_transformers(model_dir: Path, **sizes: int) -> None:
    """Expert parallel over `sizes` ranks on the mp executor: greedy tokens equal
    transformers', and the rank processes are gone after shutdown."""
    llm = LLM(str(model_dir), enable_expert_parallel=True, distributed_executor_backend="mp", **sizes, **PRESSURE)
    try:
        workers = llm.llm_engine.executor.worker_pids
        prompts = pressure_prompts(llm.llm_engine.model_config.vocab_size)
        tokens = generate(llm, prompts)
    finally:
        llm.llm_engine.shutdown()
    assert wait_until_gone(workers) == []
    with torch.inference_mode():
        assert tokens == hf_greedy(model_dir, prompts, MAX_NEW_TOKENS)


@pytest.mark.parametrize("architecture", ["mixtral", "deepseek_v3"])
def test_rank_loads_only_its_experts(architecture: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Rank 1 of 2 reads the second half of the routed experts whole, once, and never
    opens the first half; its expert_map sends the first half nowhere."""
    build_tiny_model(architecture).save_pretrained(tmp_path)
    full = load_file(tmp_path / "model.safetensors")
    log = ReadLog()
    monkeypatch.setattr(loader_module, "safe_open", log)
    model = load_model(tmp_path, OpDispatcher(get_backend("cpu")), dtype=torch.float32, parallel=EP_RANK1_OF_2).model
    expert_ids = {int(m.group(1)) for name in full if (m := ROUTED.search(name))}
    num_experts = max(expert_ids) + 1
    assert expert_ids == set(range(num_experts)) and num_experts % 2 == 0
    mine = range(num_experts // 2, num_experts)
    for name in full:
        found = ROUTED.search(name)
        if found is None:
            continue
        if int(found.group(1)) in mine:
            assert log.whole.count(name) == 1 and name not in log.slices, f"{name} not read whole once"
        else:
            assert name not in log.whole and name not in log.slices, f"another rank's {name} was read"
    moes = [layer.feed_forward for layer in model.layers if isinstance(layer.feed_forward, SparseMoE)]
    assert moes
    expected_map = [-1] * (num_experts // 2) + list(range(num_experts // 2))
    for moe in moes:
        assert moe.experts.w13.shape[0] == num_experts // 2
        assert moe.experts.expert_map.tolist() == expected_map


def test_an_ep_size_past_the_expert_count_is_refused_at_start(tmp_path: Path) -> None:
    model_dir = save_with_tokenizer(tmp_path / "mixtral2", "mixtral", {"num_local_experts": 2})
    # Refused by the engine config before any worker starts (the layout is checked there).
    with pytest.raises(ValueError, match=r"2 routed experts are fewer than the expert-parallel size 3 .*"
                                         r"a rank would hold no expert"):
        LLM(str(model_dir), data_parallel_size=3, enable_expert_parallel=True, **PRESSURE)


@pytest.mark.parametrize("experts,ranks,expected", [
    (5, 2, [range(0, 3), range(3, 5)]),
    (7, 3, [range(0, 3), range(3, 5), range(5, 7)]),
    (8, 4, [range(0, 2), range(2, 4), range(4, 6), range(6, 8)]),
    (3, 3, [range(0, 1), range(1, 2), range(2, 3)]),
])
def test_experts_are_placed_as_vllm_places_them(experts: int, ranks: int, expected: list[range]) -> None:
    """base = E // ep each, the first E % ep ranks one more (vLLM's determine_expert_map)."""
    assert [expert_range(experts, ranks, rank) for rank in range(ranks)] == expected
    assert expert_owners(experts, ranks).tolist() == [r for r, placed in enumerate(expected) for _ in placed]


def test_rank_1_of_2_loads_the_last_2_of_5_experts(tmp_path: Path) -> None:
    build_tiny_model("mixtral", num_local_experts=5).save_pretrained(tmp_path)
    model = load_model(tmp_path, OpDispatcher(get_backend("cpu")), dtype=torch.float32, parallel=EP_RANK1_OF_2).model
    moes = [layer.feed_forward for layer in model.layers if isinstance(layer.feed_forward, SparseMoE)]
    assert moes
    for moe in moes:
        assert moe.experts.w13.shape[0] == 2
        assert moe.experts.expert_map.tolist() == [-1, -1, -1, 0, 1]


#: The uneven layouts of issue 32: 5 routed experts over an expert-parallel size of 2
#: (TP=2 with gloo's default exchange needs none; all_to_all looks each pick's owner up;
#: DP=2 gathers every replica's tokens).
UNEVEN_LAYOUTS = {
    "tp2-ep": ({"tensor_parallel_size": 2}, None),
    "tp2-ep-all_to_all": ({"tensor_parallel_size": 2}, "all_to_all"),
    "dp2-ep": ({"data_parallel_size": 2}, None),
}


@pytest.mark.slow
@pytest.mark.parametrize("layout", UNEVEN_LAYOUTS)
def test_five_experts_over_two_ranks_greedy_equals_transformers(
    layout: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    sizes, strategy = UNEVEN_LAYOUTS[layout]
    if strategy is not None:
        monkeypatch.setenv(DISPATCH_ENV, strategy)
    assert_ep_greedy_equals_transformers(
        save_with_tokenizer(tmp_path / "mixtral5", "mixtral", {"num_local_experts": 5}), **sizes)
