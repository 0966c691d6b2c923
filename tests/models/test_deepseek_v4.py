"""DeepSeek-V4 through `LLM`: greedy parity with transformers' prefix-only forward on a
tiny random checkpoint (int32 tid2eid hash layers, sliding / CSA / HCA layers,
hc_mult 2), under chunked prefill with a small token budget, continuous batching,
prompts longer than the sliding window and several compression blocks, and prefix
caching; plus the checkpoint's dtype mix reaching the router contract."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from deepseek_v4_models import CSA_RATE, HCA_RATE, SLIDING_WINDOW, build_v4_dir, prefix_only_greedy

from accord import LLM
from accord.core.sampling_params import SamplingParams

NEW_TOKENS = 6
#: Past the window and several CSA/HCA blocks; one ends mid block, one is short.
PROMPT_LENGTHS = (45, 30, 11)
ENGINE_ARGS = dict(block_size=4, max_num_batched_tokens=16, max_num_seqs=4, num_gpu_blocks_override=96, max_model_len=128)


@pytest.fixture(autouse=True, scope="module")
def one_torch_thread():
    """Tiny models run fastest single-threaded on the shared machine."""
    previous = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(previous)


@pytest.fixture(scope="module")
def v4_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build_v4_dir(tmp_path_factory.mktemp("deepseek_v4") / "model")


@pytest.fixture(scope="module")
def prompts() -> list[list[int]]:
    generator = torch.Generator().manual_seed(5)
    return [torch.randint(3, 200, (n,), generator=generator).tolist() for n in PROMPT_LENGTHS]


@pytest.fixture(scope="module")
def reference_tokens(v4_dir: Path, prompts: list[list[int]]) -> list[list[int]]:
    return prefix_only_greedy(v4_dir, prompts, NEW_TOKENS)


@pytest.fixture(scope="module")
def engines(v4_dir: Path) -> dict[str, LLM]:
    return {backend: LLM(str(v4_dir), backend=backend, **ENGINE_ARGS) for backend in ("reference", "cpu")}


def greedy(llm: LLM, prompts: list[list[int]]) -> list[list[int]]:
    params = SamplingParams(max_tokens=NEW_TOKENS, temperature=0.0, ignore_eos=True)
    outputs = llm.generate([{"prompt_token_ids": p} for p in prompts], params, use_tqdm=False)
    return [list(output.outputs[0].token_ids) for output in outputs]


def test_the_test_prompts_cover_the_window_and_several_compressed_blocks() -> None:
    longest = max(PROMPT_LENGTHS)
    assert longest > SLIDING_WINDOW and longest // HCA_RATE >= 3 and longest // CSA_RATE > 3
    assert any(n % CSA_RATE and n % HCA_RATE for n in PROMPT_LENGTHS), "one prompt ends mid compression block"


@pytest.mark.slow
@pytest.mark.parametrize("backend", ["reference", "cpu"])
def test_batched_chunked_greedy_matches_transformers_prefix_only(backend, engines, prompts, reference_tokens) -> None:
    assert greedy(engines[backend], prompts) == reference_tokens


@pytest.mark.parametrize("backend", ["reference", "cpu"])
def test_each_prompt_alone_matches_transformers_prefix_only(backend, engines, prompts, reference_tokens) -> None:
    for prompt, expected in zip(prompts, reference_tokens):
        assert greedy(engines[backend], [prompt]) == [expected]


def test_a_prefix_cache_hit_reuses_compressed_state_and_gives_the_same_tokens(engines, prompts, reference_tokens):
    llm = engines["cpu"]
    greedy(llm, [prompts[0]])
    hits_before = llm.llm_engine.stats.prefix_cache_hits
    assert greedy(llm, [prompts[0]]) == [reference_tokens[0]]
    assert llm.llm_engine.stats.prefix_cache_hits > hits_before, "the repeated prompt's blocks come from the cache"


def test_hash_layers_hand_the_router_int64_token_ids_and_the_int32_table(engines) -> None:
    worker = engines["cpu"].llm_engine.executor.driver_worker
    model = worker.runner.model
    hashed = [layer.moe for layer in model.layers if layer.moe.hash_table is not None]
    assert len(hashed) == 2
    assert all(moe.hash_table.dtype == torch.int32 for moe in hashed)
    # The dispatcher's plans are keyed by every signature it has validated.
    plans = worker.ops._plans.values()
    routes = [plan.signature for plan in plans if plan.signature.op == "moe_route"]
    assert any(s.dtype("token_ids") == torch.int64 and s.dtype("hash_table") == torch.int32 for s in routes)


def test_preemption_by_recompute_rebuilds_the_compressed_state(v4_dir, prompts, reference_tokens) -> None:
    # 16 blocks of 4 tokens hold one long sequence but not all three: decodes preempt.
    llm = LLM(str(v4_dir), backend="cpu", **{**ENGINE_ARGS, "num_gpu_blocks_override": 16, "max_model_len": 64})
    assert greedy(llm, prompts) == reference_tokens
    assert llm.llm_engine.stats.num_preemptions > 0
