"""Helpers the server tests share: `accord serve` as a subprocess on a free loopback
port, and reading its /metrics."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import httpx
from prometheus_client.parser import text_string_to_metric_families

from accord.demo.model import DEMO_MODEL_NAME

API_KEY = "test-key"
#: Small limits keep startup fast and the KV cache small on a shared CI machine.
ENGINE_ARGS = {"max_model_len": 256, "kv_cache_memory": 16 << 20, "max_num_seqs": 64, "max_num_batched_tokens": 512}
ENGINE_FLAGS = tuple(
    item
    for name, value in ENGINE_ARGS.items()
    for item in ("--kv-cache-memory-bytes" if name == "kv_cache_memory" else "--" + name.replace("_", "-"), str(value))
)
STARTUP_TIMEOUT_S = 120.0


def free_port() -> int:
    """A TCP port nothing listens on right now."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


class ServerProcess:
    """`accord serve` in a subprocess, ready once /health answers."""

    def __init__(self, *flags: str, cache_dir: Path) -> None:
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        # The random demo model unless a test names one: fast, and no download.
        model = () if "--model" in flags else ("--model", DEMO_MODEL_NAME)
        command = [sys.executable, "-m", "accord", "serve", "--port", str(self.port), *model, *flags]
        env = {**os.environ, "ACCORD_CACHE_DIR": str(cache_dir)}
        # A file, not a pipe: nobody reads a pipe while tests run, and a full one blocks the server.
        self.log = tempfile.NamedTemporaryFile(mode="w+", prefix="accord-serve-", suffix=".log")
        self.process = subprocess.Popen(command, env=env, stdout=self.log, stderr=subprocess.STDOUT)
        self._wait_until_healthy()

    def _wait_until_healthy(self) -> None:
        deadline = time.monotonic() + STARTUP_TIMEOUT_S
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise RuntimeError(f"accord serve exited with {self.process.returncode}:\n{self.output()}")
            try:
                if httpx.get(f"{self.url}/health", timeout=1.0).status_code == 200:
                    return
            except httpx.TransportError:
                pass
            time.sleep(0.2)
        self.stop()
        raise RuntimeError(f"accord serve did not become healthy within {STARTUP_TIMEOUT_S} s")

    def output(self) -> str:
        """Everything the server printed so far (until stopped)."""
        self.log.seek(0)
        return self.log.read()

    def terminate(self) -> None:
        """Send SIGTERM (a graceful shutdown)."""
        self.process.send_signal(signal.SIGTERM)

    def stop(self) -> int:
        """SIGTERM, then SIGKILL if it lingers; returns the exit status."""
        if self.process.poll() is None:
            self.terminate()
            try:
                self.process.wait(timeout=30)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()
        self.log.close()
        return self.process.returncode


def scrape_metrics(http: httpx.Client) -> dict[str, float]:
    """Every sample of /metrics by name, with labels other than model_name and engine
    (the one replica's "0") appended as `[label=value]`."""
    response = http.get("/metrics")
    response.raise_for_status()
    samples: dict[str, float] = {}
    for family in text_string_to_metric_families(response.text):
        for sample in family.samples:
            extra = {k: v for k, v in sample.labels.items() if k not in ("model_name", "engine")}
            key = sample.name + "".join(f"[{k}={v}]" for k, v in sorted(extra.items()))
            samples[key] = sample.value
    return samples
