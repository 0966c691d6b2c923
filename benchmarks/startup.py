"""Start-up to ready, and where it goes: `accord serve` launched until /health answers
200 (wall seconds, median of --runs), then, with --phases, one in-process start-up
timed part by part (imports, model load, step-budget timing, profile run, KV cache and
decode-graph capture, tokenizer). Each run is a fresh process, so imports count.

    PYTHONPATH=. python benchmarks/startup.py [--model DIR] [--runs 3] [--phases]
        [-- extra `accord serve` flags, e.g. --max-num-batched-tokens 2048]

The default model is `accord bench`'s random 152M Llama (written on first use). With
`--cold-kernels` each run starts on an empty native-kernel cache (a fresh machine's
first start: the C kernels build). On a shared machine wall times swing with the load
of other processes: compare variants side by side in one session.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

#: The timed parts of an in-process start-up: (label, module, attribute path).
PHASES = (
    ("model load", "accord.core.worker.worker", "load_model"),
    ("step-budget timing", "accord.core.worker.worker", "Worker.time_step"),
    ("profile run", "accord.core.worker.worker", "Worker.determine_num_blocks"),
    ("KV cache + decode graphs", "accord.core.worker.worker", "Worker.initialize_cache"),
    ("tokenizer", "accord.core.engine.llm_engine", "load_tokenizer"),
)


def serve_until_ready(model: str, flags: list[str], env: dict[str, str]) -> float:
    """Seconds from launching `accord serve` until GET /health answers 200."""
    # Imported here: serve_latency imports part of accord, which --phases times.
    from serve_latency import free_port, wait_ready

    port = free_port()
    command = [sys.executable, "-m", "accord", "serve", "--model", model, "--port", str(port), *flags]
    server = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True, env=env)
    try:
        return wait_ready(port, server, timeout=600, path="/health", interval=0.02)
    except RuntimeError as error:
        raise SystemExit(f"accord serve: {error}:\n{server.stderr.read() if server.poll() is not None else ''}")
    finally:
        server.terminate()
        server.wait(timeout=60)


def phases(model: str, flags: list[str]) -> dict[str, float]:
    """One start-up in this process, the seconds of each part (what `accord serve`
    builds before it listens: the CLI and server imports, then the engine)."""
    import importlib

    timings: dict[str, float] = {}
    started = time.perf_counter()
    from accord.cli import launcher
    from accord.cli.main import build_parser

    timings["imports (torch, accord, server)"] = time.perf_counter() - started

    def timed(label: str, function):  # type: ignore[no-untyped-def]
        def wrapper(*args, **kwargs):  # type: ignore[no-untyped-def]
            begun = time.perf_counter()
            try:
                return function(*args, **kwargs)
            finally:
                timings[label] = timings.get(label, 0.0) + time.perf_counter() - begun

        return wrapper

    for label, module_name, path in PHASES:
        owner = importlib.import_module(module_name)
        *parents, name = path.split(".")
        for parent in parents:
            owner = getattr(owner, parent)
        setattr(owner, name, timed(label, getattr(owner, name)))
    args = build_parser().parse_args(["serve", "--model", model, *flags])
    settings = launcher.engine_config(args, args.model)
    begun = time.perf_counter()
    engine = launcher.LLMEngine(settings, launcher.RegistryBackend(settings.backend))
    timings["engine (all)"] = time.perf_counter() - begun
    timings["total"] = time.perf_counter() - started
    engine.shutdown()
    return timings


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", help="model directory (default: accord bench's random 152M Llama)")
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--phases", action="store_true", help="also time the parts of --runs in-process start-ups")
    parser.add_argument("--cold-kernels", action="store_true", help="an empty native-kernel cache for every run")
    parser.add_argument("--phase-child", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("serve_flags", nargs="*", help="extra `accord serve` flags (after --)")
    args = parser.parse_args()
    if args.model is None:
        from accord.bench.offline.model import MODEL_SHAPE, build_model

        args.model = str(build_model(Path(tempfile.gettempdir()) / "accord-bench-llama-152m", MODEL_SHAPE))
    if args.phase_child:
        print(json.dumps(phases(args.model, args.serve_flags)))
        return
    ready, parts = [], []
    for _ in range(args.runs):
        with tempfile.TemporaryDirectory() as cache:
            env = dict(os.environ, XDG_CACHE_HOME=cache) if args.cold_kernels else dict(os.environ)
            ready.append(serve_until_ready(args.model, args.serve_flags, env))
            if args.phases:
                child = [sys.executable, __file__, "--phase-child", "--model", args.model, "--", *args.serve_flags]
                if args.cold_kernels:  # the serve run above filled this cache: start the phases cold too
                    env = dict(os.environ, XDG_CACHE_HOME=tempfile.mkdtemp(dir=cache))
                done = subprocess.run(child, capture_output=True, text=True, env=env, check=True)
                parts.append(json.loads(done.stdout.splitlines()[-1]))
    print(f"accord serve to /health 200: median {statistics.median(ready):.2f} s "
          f"({', '.join(f'{t:.2f}' for t in ready)})")
    for label in parts[0] if parts else ():
        values = [p.get(label, 0.0) for p in parts]
        print(f"  {label:34s} median {statistics.median(values):6.2f} s  ({', '.join(f'{v:.2f}' for v in values)})")


if __name__ == "__main__":
    main()
