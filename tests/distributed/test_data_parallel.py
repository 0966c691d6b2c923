"""Data parallelism (`data_parallel_size`): one scheduler and KV cache per replica, the
replicas' workers in one torch.distributed world. End to end the greedy tokens equal
transformers' with the requests split over two replicas and one replica idle for part
of the run (with expert parallelism it then runs dummy batches); a layout the experts or
devices do not fit is refused before any worker starts; a killed rank fails the requests
of every replica cleanly and /health answers 503."""

from __future__ import annotations

import asyncio
import multiprocessing
import os
import signal
import time
from datetime import timedelta
from pathlib import Path

import httpx
import pytest
import torch
from engine_models import hf_greedy
from processes import wait_until_gone
from test_executor_mp import PRESSURE, pressure_prompts
from test_tp_llm import save_with_tokenizer

from accord import LLM, AsyncLLM, SamplingParams
from accord.backends import get_backend
from accord.cli.main import main as accord_main
from accord.conformance.ranks import free_port
from accord.core.distributed import destroy_parallel, init_parallel
from accord.core.errors import EngineDeadError
from accord.core.engine.llm import LLM as CoreLLM
from accord.server.app import create_app
from accord.server.serving import ServedModel

#: The first request generates this many tokens and the others SHORT: its replica runs
#: on alone once the other replica's requests are done (the idle replica's dummy batches).
LONG, SHORT = 14, 4

#: (test id, tiny architecture, enable_expert_parallel): dense GQA and MLA attention per
#: replica, and every MoE architecture with its experts split over both replicas.
VARIANTS = [
    ("llama", "llama", False),
    ("deepseek_v3", "deepseek_v3", False),
    ("mixtral-ep", "mixtral", True),
    ("qwen3_moe-ep", "qwen3_moe", True),
    ("deepseek_v3-ep", "deepseek_v3", True),
]


@pytest.mark.slow
@pytest.mark.parametrize("name,architecture,expert_parallel", VARIANTS, ids=[v[0] for v in VARIANTS])
def test_dp2_greedy_equals_transformers_with_requests_split_and_a_replica_idle(
    name: str, architecture: str, expert_parallel: bool, tmp_path: Path
) -> None:
    model_dir = save_with_tokenizer(tmp_path / name, architecture, {})
    llm = LLM(str(model_dir), data_parallel_size=2, enable_expert_parallel=expert_parallel, **PRESSURE)
    engine = llm.llm_engine
    try:
        workers = engine.executor.worker_pids
        assert len(workers) == 2
        prompts = pressure_prompts(engine.model_config.vocab_size)
        lengths = [LONG] + [SHORT] * (len(prompts) - 1)
        params = [SamplingParams(temperature=0.0, max_tokens=n, ignore_eos=True) for n in lengths]
        outputs = llm.generate([{"prompt_token_ids": p} for p in prompts], params, use_tqdm=False)
        tokens = [output.outputs[0].token_ids for output in outputs]
        replicas = engine.replica_stats
        dummies = engine.num_dummy_steps
    finally:
        engine.shutdown()
    assert wait_until_gone(workers) == []
    # Both replicas computed requests, and one stepped while the other had nothing to do.
    assert all(stats.generation_tokens > 0 for stats in replicas)
    assert sum(stats.generation_tokens for stats in replicas) == sum(lengths)
    assert replicas[0].num_steps != replicas[1].num_steps
    if expert_parallel:
        # Every step some replica computed, the other computed too or ran a dummy batch.
        assert max(dummies) > 0
        assert replicas[0].num_steps + dummies[0] == replicas[1].num_steps + dummies[1]
    else:
        assert dummies == [0, 0], "without cross-replica collectives an idle replica does not step"
    with torch.inference_mode():
        reference = hf_greedy(model_dir, prompts, LONG)
    assert tokens == [ref[:n] for ref, n in zip(reference, lengths)]


# -- layouts refused at start ----------------------------------------------------------
def test_an_ep_size_past_the_expert_count_is_refused_before_any_worker_starts(tmp_path: Path) -> None:
    model_dir = save_with_tokenizer(tmp_path / "mixtral", "mixtral", {})  # 4 routed experts
    before = set(multiprocessing.active_children())
    with pytest.raises(ValueError, match=r"4 routed experts are fewer than the expert-parallel size 5 "
                                         r"\(tensor_parallel_size 1 x data_parallel_size 5\)"):
        LLM(str(model_dir), data_parallel_size=5, enable_expert_parallel=True, **PRESSURE)
    assert set(multiprocessing.active_children()) == before


def test_the_serve_cli_refuses_that_layout_with_a_one_line_error(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    model_dir = save_with_tokenizer(tmp_path / "mixtral", "mixtral", {})
    capsys.readouterr()  # transformers' progress bars
    code = accord_main(
        ["serve", "--model", str(model_dir), "--backend", "cpu", "--port", "0", "-tp", "2", "-dp", "3",
         "--enable-expert-parallel"]
    )
    assert code == 1
    error = capsys.readouterr().err
    assert error.startswith("accord serve: error:") and "expert-parallel size 6" in error and "Traceback" not in error


class TwoDeviceCpuBackend(type(get_backend("cpu"))):  # type: ignore[misc]
    """The cpu backend on a host that reports two devices (two accelerators, say)."""

    def device_count(self) -> int | None:
        return 2


def test_more_ranks_than_devices_are_refused_with_the_numbers(tmp_path: Path) -> None:
    model_dir = save_with_tokenizer(tmp_path / "llama", "llama", {})
    with pytest.raises(ValueError, match=r"tensor_parallel_size 2 x data_parallel_size 2 needs 4 devices, but 2 are"):
        CoreLLM(str(model_dir), TwoDeviceCpuBackend, tensor_parallel_size=2, data_parallel_size=2)


@pytest.mark.parametrize("size", [0, -1])
def test_a_data_parallel_size_below_one_is_refused(size: int) -> None:
    with pytest.raises(ValueError, match=f"data_parallel_size must be at least 1, got {size}"):
        LLM("unused", data_parallel_size=size)


# -- a dead rank -----------------------------------------------------------------------
@pytest.mark.slow
def test_a_killed_rank_fails_every_replicas_requests_and_health_answers_503(tmp_path: Path) -> None:
    model_dir = save_with_tokenizer(tmp_path / "llama", "llama", {})
    engine = AsyncLLM.from_engine_args(str(model_dir), data_parallel_size=2, **PRESSURE)
    workers = engine.engine.executor.worker_pids
    app = create_app(engine, ServedModel("tiny", str(model_dir), engine.max_model_len, engine.model_config.vocab_size))
    params = SamplingParams(temperature=0.0, max_tokens=200, ignore_eos=True)

    async def scenario() -> tuple[list[BaseException | None], list[int], int]:
        first_outputs = asyncio.Event()
        seen: list[int] = []

        async def run(request: int) -> BaseException | None:
            try:
                async for _ in engine.generate({"prompt_token_ids": [1, 2, 3 + request]}, params, f"r{request}"):
                    seen.append(request)
                    if len(set(seen)) == 2:
                        first_outputs.set()
            except BaseException as error:  # noqa: BLE001 - handed to the test
                return error
            return None

        tasks = [asyncio.create_task(run(request)) for request in range(2)]
        await asyncio.wait_for(first_outputs.wait(), timeout=120)
        # Both requests stream, one per replica; then replica 1's only rank dies.
        replicas = engine.engine.replica_stats
        running = [stats.num_running for stats in replicas]
        os.kill(workers[1], signal.SIGKILL)
        errors = await asyncio.wait_for(asyncio.gather(*tasks), timeout=60)
        async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://test") as client:
            health = await client.get("/health")
        return errors, running, health.status_code

    try:
        errors, running, health = asyncio.run(scenario())
    finally:
        asyncio.run(engine.shutdown())
        engine.engine.shutdown()
    assert running == [1, 1]
    assert all(isinstance(error, EngineDeadError) for error in errors), errors
    assert "worker rank 1 died" in str(errors[0])
    assert health == 503
    assert wait_until_gone(workers) == []


# -- collective timeouts ---------------------------------------------------------------
def _lone_collective_rank(rank: int, init_method: str, out_dir: str) -> None:
    """Rank 0 enters an all_reduce over the expert-parallel group (the whole world) that
    rank 1 never joins; rank 1 stays in the world until rank 0 has reported, so only the
    group's timeout can end rank 0's wait."""
    context = init_parallel(get_backend("cpu"), rank, 2, 1, init_method, expert_parallel=True,
                            timeout=timedelta(seconds=3))
    report = Path(out_dir, "rank0.txt")
    if rank == 0:
        try:
            context.ep_comm().all_reduce(torch.ones(4))  # type: ignore[union-attr]
            report.write_text("returned")
        except RuntimeError as error:
            report.write_text(f"raised: {error}")
    else:
        deadline = time.monotonic() + 120
        while not report.exists() and time.monotonic() < deadline:
            time.sleep(0.1)
        Path(out_dir, "rank1.txt").write_text("rank 0 reported" if report.exists() else "gave up waiting")
    destroy_parallel()


@pytest.mark.slow
def test_a_collective_whose_peer_never_comes_raises_after_the_group_timeout(tmp_path: Path) -> None:
    init_method = f"tcp://127.0.0.1:{free_port()}"
    torch.multiprocessing.spawn(_lone_collective_rank, args=(init_method, str(tmp_path)), nprocs=2, join=True)
    assert (tmp_path / "rank1.txt").read_text() == "rank 0 reported", "rank 0 waited on: no timeout"
    assert (tmp_path / "rank0.txt").read_text().startswith("raised:")
