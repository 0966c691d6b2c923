"""The cost of `accord bench serve`'s client itself, against a stub server that answers
every streamed request at once (no model, nothing to wait for), so all the time the
client spends is its own: CPU microseconds per streamed chunk and per request, and the
chunks a second it can take in. With `--vllm-venv`, vLLM's own client (its aiohttp
request function from vllm.benchmarks) runs the same requests from that virtualenv.

    python benchmarks/bench_client_overhead.py [--requests 256] [--tokens 128] [--concurrency 64] [--vllm-venv DIR]

The stub runs in a process of its own (uvicorn), so on a 2-core host client and stub
each have a core; the figure to compare with a real server is the client's CPU per
chunk: at N chunks a second from the server, the client takes N times that of a core.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import socket
import subprocess
import sys
import time
from pathlib import Path

import httpx

MODEL = "stub"


def stub_app(tokens: int):
    """A FastAPI app whose completions stream `tokens` one-token chunks, a usage chunk
    and [DONE], all at once."""
    from fastapi import FastAPI
    from fastapi.responses import StreamingResponse

    app = FastAPI()
    chunk = "data: " + json.dumps({"choices": [{"index": 0, "text": "tok ", "finish_reason": None}]}) + "\n\n"
    usage = "data: " + json.dumps({"choices": [], "usage": {"prompt_tokens": 8, "completion_tokens": tokens}}) + "\n\n"
    body = (chunk * tokens + usage + "data: [DONE]\n\n").encode()

    @app.get("/v1/models")
    async def models() -> dict:
        return {"object": "list", "data": [{"id": MODEL, "object": "model"}]}

    @app.post("/v1/completions")
    async def completions() -> StreamingResponse:
        async def stream():
            # One write a chunk, as a server writes them.
            for start in range(0, len(body), len(chunk)):
                yield body[start : start + len(chunk)]

        return StreamingResponse(stream(), media_type="text/event-stream")

    return app


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def wait_ready(url: str, timeout: float = 60.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            if httpx.get(f"{url}/v1/models", timeout=1.0).status_code == 200:
                return
        except httpx.TransportError:
            time.sleep(0.1)
    raise RuntimeError(f"the stub at {url} did not start")


async def measure_ours(url: str, requests: int, tokens: int, concurrency: int) -> dict:
    """Our client over `requests` requests: wall and CPU seconds of the measured part."""
    from accord.bench.serve.datasets import SampleRequest
    from accord.bench.serve.http_session import AiohttpSession
    from accord.bench.serve.request_types import RequestSettings
    from accord.bench.serve.runner import RungSpec, run_rung

    settings = RequestSettings("openai", f"{url}/v1/completions", MODEL, ignore_eos=True)
    batch = [SampleRequest([1, 2, 3], 3, tokens) for _ in range(requests)]
    spec = RungSpec(float("inf"), max_concurrency=concurrency, progress=False)
    async with AiohttpSession(concurrency, {}) as http:
        cpu = time.process_time()
        run = await run_rung(http, settings, batch, [], spec, url)
        cpu = time.process_time() - cpu
    chunks = sum(1 + len(o.itl) for o in run.outcomes if o.success)
    return {"client": "accord bench serve (aiohttp)", "wall_s": run.duration_s, "cpu_s": cpu, "chunks": chunks,
            "failed": sum(not o.success for o in run.outcomes)}  # fmt: skip


def measure_vllm(venv: Path, url: str, requests: int, tokens: int, concurrency: int) -> dict:
    """vLLM's request function over the same requests, in its virtualenv."""
    script = Path(__file__).with_name("vllm_client_overhead.py")
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    done = subprocess.run(
        [str(venv / "bin" / "python"), str(script), url, MODEL, str(requests), str(tokens), str(concurrency)],
        env=env, capture_output=True, text=True, check=True,
    )  # fmt: skip
    return json.loads(done.stdout.strip().splitlines()[-1])


def report(figures: dict) -> str:
    per_chunk = 1e6 * figures["cpu_s"] / figures["chunks"]
    return (f"{figures['client']}: {figures['chunks']} chunks in {figures['wall_s']:.2f} s wall "
            f"({figures['chunks'] / figures['wall_s']:.0f} chunks/s), client CPU {figures['cpu_s']:.2f} s = "
            f"{per_chunk:.1f} us a chunk; failed {figures['failed']}")  # fmt: skip


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--requests", type=int, default=256)
    parser.add_argument("--tokens", type=int, default=128, help="chunks per request")
    parser.add_argument("--concurrency", type=int, default=64)
    parser.add_argument("--vllm-venv", type=Path, help="virtualenv with vllm(-cpu): measure its client too")
    parser.add_argument("--serve-stub", type=int, metavar="PORT", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.serve_stub:
        import uvicorn

        uvicorn.run(stub_app(args.tokens), host="127.0.0.1", port=args.serve_stub, log_level="warning")
        return 0
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    stub = subprocess.Popen([sys.executable, __file__, "--serve-stub", str(port), "--tokens", str(args.tokens)])
    try:
        wait_ready(url)
        print(report(asyncio.run(measure_ours(url, args.requests, args.tokens, args.concurrency))))
        if args.vllm_venv:
            print(report(measure_vllm(args.vllm_venv, url, args.requests, args.tokens, args.concurrency)))
    finally:
        stub.terminate()
        stub.wait()
    return 0


if __name__ == "__main__":
    sys.exit(main())
