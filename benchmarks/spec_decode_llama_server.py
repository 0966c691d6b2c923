"""llama.cpp's `llama-server` on the speculative decoding benchmark's prompts, one mode
(a set of its speculation flags) per server start: greedy chat completions one at a
time (batch 1: one slot), EOS ignored, and the drafted/accepted counts its replies'
`timings` report. benchmarks/spec_decode.py runs it beside accord's modes
(`--llama-server`)."""

from __future__ import annotations

import json
import tempfile
import time
import urllib.request
from pathlib import Path

from serve_latency import free_port, running

from accord._openmp_wait import peer_environment


def chat(port: int, conversation: list[dict[str, str]], tokens: int) -> dict:
    """One greedy chat completion of `tokens` tokens (EOS ignored), llama-server's reply."""
    body = {"messages": conversation, "max_tokens": tokens, "temperature": 0.0, "top_k": 1, "ignore_eos": True,
            "cache_prompt": True}
    request = urllib.request.Request(f"http://127.0.0.1:{port}/v1/chat/completions", json.dumps(body).encode(),
                                     {"Content-Type": "application/json"})
    with urllib.request.urlopen(request, timeout=600) as reply:
        return json.load(reply)


def measure(binary: str, model: str, conversations: list[list[dict[str, str]]], tokens: int, threads: int,
            flags: list[str]) -> tuple[float, int, int, int]:
    """(output tokens/s over the set, one request at a time; tokens; drafted; accepted)
    of llama-server started on `model` with `flags`, after a warm-up request."""
    port = free_port()
    command = [binary, "-m", model, "--host", "127.0.0.1", "--port", str(port), "-t", str(threads),
               "-np", "1", "-c", "2048", *flags]
    with tempfile.TemporaryDirectory() as scratch, running(command, peer_environment(), Path(scratch) / "server.log", port, 300,
                                                           ready_path="/health"):
        chat(port, conversations[0], 8)
        generated = drafted = accepted = 0
        start = time.perf_counter()
        for conversation in conversations:
            reply = chat(port, conversation, tokens)
            generated += reply["usage"]["completion_tokens"]
            timings = reply.get("timings", {})
            drafted += timings.get("draft_n", 0)
            accepted += timings.get("draft_n_accepted", 0)
        seconds = time.perf_counter() - start
    return generated / seconds, generated, drafted, accepted
