"""`accord serve -tp 2`: answers the openai client with one rank's greedy text, SIGTERM
leaves no process behind, a killed worker gives the requests in flight a clean error,
/health 503, a non-zero exit and one traceback in the log, and a worker that fails to
start prints its traceback once."""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import subprocess
import sys
from pathlib import Path

import httpx
import openai
import pytest
from processes import child_pids, wait_until_gone
from server_harness import ServerProcess, free_port

from accord import LLM, SamplingParams

PROMPT = "Once upon a time"
MAX_TOKENS = 8
#: Requests streaming when the worker dies, and requests sent after.
IN_FLIGHT = 4


def serve_tp2(model_dir: Path, cache_dir: Path) -> ServerProcess:
    return ServerProcess(
        "--model", str(model_dir), "--backend", "cpu", "-tp", "2", "--max-model-len", "256",
        "--kv-cache-memory-bytes", str(8 << 20), "--shutdown-timeout", "10",
        cache_dir=cache_dir,
    )


def worker_pids(server: ServerProcess) -> list[int]:
    """The server's worker processes (multiprocessing's resource tracker excluded)."""
    return [pid for pid in child_pids(server.process.pid) if b"spawn_main" in Path(f"/proc/{pid}/cmdline").read_bytes()]


@pytest.mark.slow
def test_serve_tp2_answers_the_openai_client_and_sigterm_leaves_no_process(llama_dir: Path, tmp_path: Path) -> None:
    server = serve_tp2(llama_dir, tmp_path)
    try:
        workers = worker_pids(server)
        assert len(workers) == 2
        client = openai.OpenAI(base_url=f"{server.url}/v1", api_key="unused", timeout=120)
        completion = client.completions.create(
            model=str(llama_dir), prompt=PROMPT, max_tokens=MAX_TOKENS, temperature=0.0, extra_body={"ignore_eos": True}
        )
        # The ranks' collectives use no deprecated torch.distributed call (each rank printed its FutureWarning).
        assert "Warning" not in server.output(), server.output()
        server.terminate()
        assert server.process.wait(timeout=60) == 0
        assert wait_until_gone(workers) == []
    finally:
        server.stop()
    one_rank = LLM(str(llama_dir), backend="cpu", max_model_len=256, num_gpu_blocks_override=32)
    expected = one_rank.generate(PROMPT, SamplingParams(temperature=0.0, max_tokens=MAX_TOKENS, ignore_eos=True))
    assert completion.choices[0].text == expected[0].outputs[0].text
    assert completion.usage.completion_tokens == MAX_TOKENS


@pytest.mark.slow
def test_a_killed_worker_errors_the_requests_in_flight_turns_health_503_and_exits_nonzero(
    llama_dir: Path, tmp_path: Path
) -> None:
    server = serve_tp2(llama_dir, tmp_path)
    try:
        workers = worker_pids(server)
        body = {"model": str(llama_dir), "prompt": PROMPT, "max_tokens": 200, "stream": True, "ignore_eos": True}
        with contextlib.ExitStack() as streams:
            responses = [
                streams.enter_context(httpx.stream("POST", f"{server.url}/v1/completions", json=body, timeout=60))
                for _ in range(IN_FLIGHT)
            ]
            lines = [response.iter_lines() for response in responses]
            firsts = [next(line for line in stream if line) for stream in lines]
            os.kill(workers[1], signal.SIGKILL)
            rests = [[line for line in stream if line] for stream in lines]
        # Requests after the death fail at once (the server exits a few seconds later).
        late = [httpx.post(f"{server.url}/v1/completions", json={"prompt": PROMPT, "max_tokens": 2}, timeout=10)
                for _ in range(IN_FLIGHT)]
        health = httpx.get(f"{server.url}/health", timeout=10).status_code
        for first, rest in zip(firsts, rests):
            events = [json.loads(line.removeprefix("data: ")) for line in [first, *rest] if line != "data: [DONE]"]
            errors = [event["error"] for event in events if "error" in event]
            # The server keeps engine details in its log; the client gets a clean 5xx-type error.
            assert len(errors) == 1 and errors[0]["type"] == "internal_server_error", events[-1]
        assert all(response.status_code >= 500 for response in late), [response.text for response in late]
        assert "worker rank 1 died" in server.output()
        assert health == 503
        assert server.process.wait(timeout=60) != 0
        assert wait_until_gone(workers) == []
        # One death, one traceback: not one more for each request it failed.
        log = server.output()
        assert log.count("Traceback (most recent call last)") == 1, log
        assert log.count("the engine failed a request") == 2 * IN_FLIGHT, log
    finally:
        server.stop()


@pytest.mark.slow
def test_a_worker_that_fails_to_start_prints_its_traceback_once(llama_dir: Path, tmp_path: Path) -> None:
    # Half a weights file: the engine reads config and tokenizer, each worker fails to load.
    broken = tmp_path / "broken"
    shutil.copytree(llama_dir, broken)
    for weights in broken.glob("*.safetensors"):
        weights.write_bytes(weights.read_bytes()[: weights.stat().st_size // 2])
    command = [sys.executable, "-m", "accord", "serve", "--model", str(broken), "--backend", "cpu", "-tp", "2",
               "--port", str(free_port()), "--max-model-len", "256", "--kv-cache-memory-bytes", str(8 << 20)]
    environment = {**os.environ, "ACCORD_CACHE_DIR": str(tmp_path)}
    run = subprocess.run(command, capture_output=True, text=True, timeout=300, env=environment)
    output = run.stdout + run.stderr
    assert run.returncode == 1, output
    assert output.count("Traceback (most recent call last)") == 1, output
    assert output.count("SafetensorError") == 2, output  # the traceback's last line, and the one-line error
    assert "accord serve: error: worker rank" in output and "failed to start" in output, output
