"""The Ray executor on a local Ray cluster: TP=2 over two actors gives transformers'
greedy tokens, each TP group is one STRICT_PACK placement group, another process
attaches to a running cluster through RAY_ADDRESS, a killed actor fails the requests in
flight with a clean EngineDeadError, a cluster too small or a worker that cannot start
says so, and `accord serve --distributed-executor-backend ray` (starting a local
cluster) answers the openai client."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import openai
import pytest
import server_harness
from engine_models import hf_greedy
from processes import assert_killing_a_worker_fails_the_engine, child_pids, wait_until_gone
from server_harness import ServerProcess

from accord import LLM, LLMEngine, SamplingParams
from accord.core.errors import WorkerStartupError
from accord.core.executor import ray as ray_executor

pytestmark = pytest.mark.ray

MAX_NEW_TOKENS = 6
GREEDY = SamplingParams(temperature=0.0, max_tokens=MAX_NEW_TOKENS, ignore_eos=True)
RAY_TP2 = dict(backend="cpu", tensor_parallel_size=2, distributed_executor_backend="ray", max_model_len=256)
#: Ray actors start slowly on a busy 2-core machine (a fresh Python importing torch each).
SERVE_STARTUP_TIMEOUT_S = 400.0


def descendants(pid: int) -> list[int]:
    """Every live process below `pid`."""
    found, frontier = [], [pid]
    while frontier:
        children = child_pids(frontier.pop())
        found += children
        frontier += children
    return found


def process_title(pid: int) -> str:
    """A process's command line as it shows it (Ray names its workers `ray::<Class>`)."""
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace").strip()
    except OSError:
        return ""


def accord_groups(ray: Any) -> list[dict]:
    """The placement groups the executor made (by their name), live or removed."""
    return [g for g in ray.util.placement_group_table().values() if g["name"].startswith("accord-tp-group-")]


def test_tp2_on_ray_actors_gives_transformers_greedy_tokens_in_one_strict_pack_group(
    ray_cluster: Any, llama_dir: Path
) -> None:
    prompts = [[1, 2, 3, 4, 5], list(range(7, 60)), [11] * 20]
    llm = LLM(str(llama_dir), max_num_batched_tokens=32, num_gpu_blocks_override=32, **RAY_TP2)
    try:
        executor = llm.llm_engine.executor
        assert isinstance(executor, ray_executor.RayExecutor)
        pids = executor.worker_pids
        assert len(set(pids)) == 2 and os.getpid() not in pids
        live = [g for g in accord_groups(ray_cluster) if g["state"] == "CREATED"]
        assert [(g["strategy"], len(g["bundles"])) for g in live] == [("STRICT_PACK", 2)]
        outputs = llm.generate([{"prompt_token_ids": p} for p in prompts], GREEDY, use_tqdm=False)
        tokens = [output.outputs[0].token_ids for output in outputs]
        assert llm.llm_engine.stats.kv_blocks_used == 0
    finally:
        llm.llm_engine.shutdown()
    assert wait_until_gone(pids) == []
    assert all(g["state"] == "REMOVED" for g in accord_groups(ray_cluster))
    assert ray_cluster.is_initialized(), "the executor must not disconnect a connection it did not make"
    assert tokens == hf_greedy(llama_dir, prompts, MAX_NEW_TOKENS)


ATTACH_SCRIPT = """
import sys
import ray
from accord import LLM, SamplingParams

if __name__ == "__main__":
    llm = LLM(sys.argv[1], backend="cpu", distributed_executor_backend="ray", max_model_len=256,
              num_gpu_blocks_override=32)
    params = SamplingParams(temperature=0.0, max_tokens=int(sys.argv[2]), ignore_eos=True)
    output = llm.generate([{"prompt_token_ids": [5, 6, 7, 8]}], params, use_tqdm=False)
    print(ray.get_runtime_context().gcs_address)
    print(*output[0].outputs[0].token_ids, flush=True)
    llm.llm_engine.shutdown()
"""


def test_a_process_attaches_through_ray_address_and_leaves_the_cluster_running(
    ray_cluster: Any, llama_dir: Path, tmp_path: Path
) -> None:
    cpus = ray_cluster.cluster_resources()["CPU"]
    script = tmp_path / "attach.py"
    script.write_text(ATTACH_SCRIPT)
    address = ray_cluster.get_runtime_context().gcs_address
    env = {**os.environ, "RAY_ADDRESS": address}
    result = subprocess.run(
        [sys.executable, str(script), str(llama_dir), str(MAX_NEW_TOKENS)],
        env=env, capture_output=True, text=True, timeout=600,
    )
    assert result.returncode == 0, result.stderr[-4000:]
    attached_to, token_line = result.stdout.strip().splitlines()[-2:]
    assert attached_to == address
    tokens = [int(token) for token in token_line.split()]
    assert tokens == hf_greedy(llama_dir, [[5, 6, 7, 8]], MAX_NEW_TOKENS)[0]
    # The attached process freed its placement group and left the cluster running.
    assert ray_cluster.is_initialized() and ray_cluster.cluster_resources().get("CPU") == cpus
    assert all(g["state"] == "REMOVED" for g in accord_groups(ray_cluster))


def test_a_killed_actor_fails_the_requests_in_flight_cleanly(ray_cluster: Any, llama_dir: Path) -> None:
    engine = LLMEngine.from_engine_args(str(llama_dir), num_gpu_blocks_override=32, **RAY_TP2)
    pids = engine.executor.worker_pids
    try:
        assert_killing_a_worker_fails_the_engine(engine, rank=1, timeout=90)
        assert engine.executor.dead_reason is not None
    finally:
        engine.shutdown()
    assert wait_until_gone(pids) == []
    assert all(g["state"] == "REMOVED" for g in accord_groups(ray_cluster))


def test_a_cluster_too_small_for_the_tp_group_says_what_it_has(
    ray_cluster: Any, llama_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(ray_executor, "PLACEMENT_TIMEOUT_S", 3.0)
    with pytest.raises(WorkerStartupError, match=r"could not place 1 group\(s\) of 8 x \{CPU: 1\}.*it has"):
        LLM(str(llama_dir), **{**RAY_TP2, "tensor_parallel_size": 8})
    assert all(g["state"] == "REMOVED" for g in accord_groups(ray_cluster))


def test_an_actor_that_cannot_start_names_its_rank_and_the_cause(ray_cluster: Any, tmp_path: Path) -> None:
    (tmp_path / "config.json").write_text('{"architectures": ["NoSuchForCausalLM"]}')
    with pytest.raises(WorkerStartupError, match=r"worker rank \d failed to start: .*NoSuchForCausalLM"):
        LLM(str(tmp_path), **RAY_TP2)
    assert all(g["state"] == "REMOVED" for g in accord_groups(ray_cluster))


def test_serve_with_the_ray_backend_starts_a_local_cluster_and_answers_the_openai_client(
    ray_installed: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Without RAY_ADDRESS the server starts (and at exit stops) a local cluster of its own.
    monkeypatch.delenv("RAY_ADDRESS", raising=False)
    monkeypatch.setattr(server_harness, "STARTUP_TIMEOUT_S", SERVE_STARTUP_TIMEOUT_S)
    prompt, max_tokens = "Once upon a time", 8
    server = ServerProcess(
        "--backend", "cpu", "-tp", "2", "--distributed-executor-backend", "ray", "--max-model-len", "256",
        "--kv-cache-memory-bytes", str(8 << 20), "--shutdown-timeout", "10",
        cache_dir=tmp_path,
    )
    try:
        client = openai.OpenAI(base_url=f"{server.url}/v1", api_key="unused", timeout=120)
        completion = client.completions.create(
            model=server_harness.DEMO_MODEL_NAME, prompt=prompt, max_tokens=max_tokens, temperature=0.0,
            extra_body={"ignore_eos": True},
        )
        # The local cluster's processes (GCS, raylet, the actors) are the server's descendants.
        cluster = descendants(server.process.pid)
        actors = [pid for pid in cluster if process_title(pid).startswith("ray::RayWorkerActor")]
        assert len(actors) == 2, {pid: process_title(pid) for pid in cluster}
        server.terminate()
        assert server.process.wait(timeout=90) == 0
        assert wait_until_gone(cluster) == []
    finally:
        server.stop()
    monkeypatch.setenv("ACCORD_CACHE_DIR", str(tmp_path))
    one_rank = LLM(server_harness.DEMO_MODEL_NAME, backend="cpu", max_model_len=256, num_gpu_blocks_override=32)
    expected = one_rank.generate(prompt, SamplingParams(temperature=0.0, max_tokens=max_tokens, ignore_eos=True))
    assert completion.choices[0].text == expected[0].outputs[0].text
    assert completion.usage.completion_tokens == max_tokens
