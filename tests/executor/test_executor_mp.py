"""The mp executor: a worker process per rank, tensor parallelism over gloo giving the
same greedy tokens as one rank and transformers, and its failure behaviour (a dead
worker is a clean EngineDeadError, start-up failures name the rank, nothing is left
running)."""

from __future__ import annotations

import multiprocessing
import signal
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from engine_models import hf_greedy
from processes import assert_killing_a_worker_fails_the_engine, wait_until_gone

from accord import LLM, LLMEngine, SamplingParams
from accord.core.errors import WorkerError, WorkerStartupError
from accord.core.executor.mp import MultiprocExecutor

MAX_NEW_TOKENS = 6
#: Small budgets force chunked prefill (64 tokens a step) and preemption (too few
#: blocks for every request at once); the shared prefix feeds the prefix cache.
PRESSURE = dict(
    backend="cpu",
    max_model_len=256,
    max_num_batched_tokens=64,
    max_num_seqs=8,
    num_gpu_blocks_override=20,
    enable_prefix_caching=True,
)
GREEDY = SamplingParams(temperature=0.0, max_tokens=MAX_NEW_TOKENS, ignore_eos=True)


def pressure_prompts(vocab_size: int) -> list[list[int]]:
    generator = torch.Generator().manual_seed(3)
    prefix = torch.randint(0, vocab_size, (40,), generator=generator).tolist()
    prompts = []
    for index, length in enumerate([90, 70, 120, 30, 60, 100, 50, 80]):
        tokens = torch.randint(0, vocab_size, (length,), generator=generator).tolist()
        prompts.append(prefix + tokens if index % 2 == 0 else tokens)
    return prompts


def generate(llm: LLM, prompts: list[list[int]]) -> list[list[int]]:
    outputs = llm.generate([{"prompt_token_ids": p} for p in prompts], GREEDY, use_tqdm=False)
    return [output.outputs[0].token_ids for output in outputs]


@pytest.mark.slow
@pytest.mark.parametrize("architecture", ["llama", "deepseek_v3"])
def test_tp2_greedy_equals_tp1_and_transformers_under_chunking_caching_and_preemption(
    architecture: str, request: pytest.FixtureRequest
) -> None:
    model_dir: Path = request.getfixturevalue(f"{architecture}_dir")
    tp2 = LLM(str(model_dir), tensor_parallel_size=2, **PRESSURE)
    try:
        executor = tp2.llm_engine.executor
        assert isinstance(executor, MultiprocExecutor) and len(executor.worker_pids) == 2
        prompts = pressure_prompts(tp2.llm_engine.model_config.vocab_size)
        tp2_tokens = generate(tp2, prompts)
        stats = tp2.llm_engine.stats
        assert stats.num_preemptions > 0 and stats.prefix_cache_hits > 0
        assert stats.kv_blocks_used == 0
    finally:
        tp2.llm_engine.shutdown()
    assert wait_until_gone(executor.worker_pids) == []
    tp1 = LLM(str(model_dir), **PRESSURE)
    assert tp2_tokens == generate(tp1, prompts)
    assert tp2_tokens == hf_greedy(model_dir, prompts, MAX_NEW_TOKENS)


@pytest.fixture(scope="module")
def mp_engine(llama_dir: Path):
    """One rank in a worker process (the cheapest mp engine)."""
    engine = LLMEngine.from_engine_args(
        str(llama_dir), backend="cpu", distributed_executor_backend="mp", max_model_len=256, num_gpu_blocks_override=32
    )
    yield engine
    engine.shutdown()


@pytest.mark.slow
def test_a_method_raising_in_a_worker_names_the_rank_and_the_worker_serves_on(mp_engine) -> None:
    with pytest.raises(WorkerError, match="worker rank 0: AttributeError"):
        mp_engine.executor.collective_rpc("no_such_method")
    mp_engine.add_request("after", {"prompt_token_ids": [1, 2, 3]}, GREEDY)
    while mp_engine.has_unfinished_requests():
        outputs = mp_engine.step()
    assert len(outputs[0].outputs[0].token_ids) == MAX_NEW_TOKENS


@pytest.mark.slow
def test_a_worker_that_cannot_start_names_its_rank_and_the_cause(tmp_path: Path) -> None:
    (tmp_path / "config.json").write_text('{"architectures": ["NoSuchForCausalLM"]}')
    before = set(multiprocessing.active_children())
    with pytest.raises(WorkerStartupError, match=r"worker rank \d failed to start: .*NoSuchForCausalLM"):
        LLM(str(tmp_path), backend="cpu", tensor_parallel_size=2)
    assert set(multiprocessing.active_children()) <= before


@pytest.mark.slow
def test_a_killed_worker_fails_the_requests_in_flight_and_stops_every_worker(llama_dir: Path) -> None:
    engine = LLMEngine.from_engine_args(
        str(llama_dir), backend="cpu", tensor_parallel_size=2, max_model_len=256, num_gpu_blocks_override=32
    )
    pids = engine.executor.worker_pids
    try:
        assert_killing_a_worker_fails_the_engine(engine, rank=1, timeout=60)
    finally:
        engine.shutdown()
    assert wait_until_gone(pids) == []


ORPHAN_SCRIPT = """
import sys, time
from accord import LLM

if __name__ == "__main__":
    llm = LLM(sys.argv[1], backend="cpu", tensor_parallel_size=2, max_model_len=128, num_gpu_blocks_override=16)
    print(*llm.llm_engine.executor.worker_pids, flush=True)
    time.sleep(600)
"""


@pytest.mark.slow
def test_sigterm_to_an_offline_process_leaves_no_worker_behind(llama_dir: Path, tmp_path: Path) -> None:
    script = tmp_path / "offline.py"
    script.write_text(ORPHAN_SCRIPT)
    process = subprocess.Popen([sys.executable, str(script), str(llama_dir)], stdout=subprocess.PIPE, text=True)
    try:
        pids = [int(pid) for pid in process.stdout.readline().split()]
        assert len(pids) == 2
        process.send_signal(signal.SIGTERM)
        process.wait(timeout=60)
        assert wait_until_gone(pids) == []
    finally:
        process.kill()
        process.wait()


@pytest.mark.slow
def test_async_scheduling_over_worker_processes_gives_the_same_tokens_and_a_dead_worker_fails_cleanly(
    llama_dir: Path,
) -> None:
    """Steps run on the executor's step thread, the engine schedules the next one
    meanwhile: the same greedy tokens as one synchronous rank under chunking, caching
    and preemption, and a killed worker still ends in EngineDeadError, never a hang."""
    tp2 = LLM(str(llama_dir), tensor_parallel_size=2, async_scheduling=True, **PRESSURE)
    pids = tp2.llm_engine.executor.worker_pids
    try:
        prompts = pressure_prompts(tp2.llm_engine.model_config.vocab_size)
        tokens = generate(tp2, prompts)
        assert tp2.llm_engine.stats.num_preemptions > 0 and tp2.llm_engine.stats.kv_blocks_used == 0
        assert_killing_a_worker_fails_the_engine(tp2.llm_engine, rank=1, timeout=60)
    finally:
        tp2.llm_engine.shutdown()
    assert wait_until_gone(pids) == []
    assert tokens == generate(LLM(str(llama_dir), **PRESSURE), prompts)
