"""`accord serve -tp 2`: answers the openai client with one rank's greedy text, SIGTERM
leaves no process behind, and a killed worker gives the request in flight a clean
error, /health 503 and a non-zero exit."""

from __future__ import annotations

import json
import os
import signal
from pathlib import Path

import httpx
import openai
from processes import child_pids, wait_until_gone
from server_harness import ServerProcess

from accord import LLM, SamplingParams

PROMPT = "Once upon a time"
MAX_TOKENS = 8


def serve_tp2(model_dir: Path, cache_dir: Path) -> ServerProcess:
    return ServerProcess(
        "--model", str(model_dir), "--backend", "cpu", "-tp", "2", "--max-model-len", "256",
        "--kv-cache-memory-bytes", str(8 << 20), "--shutdown-timeout", "10",
        cache_dir=cache_dir,
    )


def worker_pids(server: ServerProcess) -> list[int]:
    """The server's worker processes (multiprocessing's resource tracker excluded)."""
    return [pid for pid in child_pids(server.process.pid) if b"spawn_main" in Path(f"/proc/{pid}/cmdline").read_bytes()]


def test_serve_tp2_answers_the_openai_client_and_sigterm_leaves_no_process(llama_dir: Path, tmp_path: Path) -> None:
    server = serve_tp2(llama_dir, tmp_path)
    try:
        workers = worker_pids(server)
        assert len(workers) == 2
        client = openai.OpenAI(base_url=f"{server.url}/v1", api_key="unused", timeout=120)
        completion = client.completions.create(
            model=str(llama_dir), prompt=PROMPT, max_tokens=MAX_TOKENS, temperature=0.0, extra_body={"ignore_eos": True}
        )
        server.terminate()
        assert server.process.wait(timeout=60) == 0
        assert wait_until_gone(workers) == []
    finally:
        server.stop()
    one_rank = LLM(str(llama_dir), backend="cpu", max_model_len=256, num_gpu_blocks_override=32)
    expected = one_rank.generate(PROMPT, SamplingParams(temperature=0.0, max_tokens=MAX_TOKENS, ignore_eos=True))
    assert completion.choices[0].text == expected[0].outputs[0].text
    assert completion.usage.completion_tokens == MAX_TOKENS


def test_a_killed_worker_errors_the_request_in_flight_turns_health_503_and_exits_nonzero(
    llama_dir: Path, tmp_path: Path
) -> None:
    server = serve_tp2(llama_dir, tmp_path)
    try:
        workers = worker_pids(server)
        body = {"model": str(llama_dir), "prompt": PROMPT, "max_tokens": 200, "stream": True, "ignore_eos": True}
        with httpx.stream("POST", f"{server.url}/v1/completions", json=body, timeout=60) as response:
            lines = response.iter_lines()
            first = next(line for line in lines if line)
            os.kill(workers[1], signal.SIGKILL)
            rest = [line for line in lines if line]
        health = httpx.get(f"{server.url}/health", timeout=10).status_code
        events = [json.loads(line.removeprefix("data: ")) for line in [first, *rest] if line != "data: [DONE]"]
        errors = [event["error"] for event in events if "error" in event]
        # The server keeps engine details in its log; the client gets a clean 5xx-type error.
        assert len(errors) == 1 and errors[0]["type"] == "internal_server_error", events[-1]
        assert "worker rank 1 died" in server.output()
        assert health == 503
        assert server.process.wait(timeout=60) != 0
        assert wait_until_gone(workers) == []
    finally:
        server.stop()
