"""Disaggregated prefill/decode beside one co-located instance, on a bursty trace
(issue 33's benchmark): long prompts (2-4k tokens) arriving in bursts beside steady
short chats, each config on the same two cores.

    PYTHONPATH=. python benchmarks/pd_bursty.py [--model PATH] [--duration 300] \\
        [--chat-rate 1.0] [--chat-input-len 128] [--chat-output-len 64] \\
        [--long-rate 0.05] [--long-burstiness 0.1] [--long-input-len 3072] [--long-output-len 16] \\
        [--chat-slo ttft:2000 tpot:200] [--long-slo ttft:60000] [--configs colocated,pd] [--out-dir DIR]

Configs (each started, measured on the same seeded trace, and stopped before the next):
- `colocated`: one `accord serve` on cores 0-1 (`taskset -c 0,1`, 2 torch threads);
- `pd`: a prefill instance on core 0 and a decode instance on core 1 (`taskset -c 0` /
  `-c 1`, one torch thread each) joined by NixlConnector (UCX over loopback TCP unless
  UCX_TLS is set), behind `accord router --prefill URL --decode URL`. The router and this
  client are not pinned: they share the two cores with the instances in both configs.

The trace is `accord bench serve`'s machinery: two `random` datasets (token ids sent as
ids, EOS ignored, greedy), the chats arriving Poisson at `--chat-rate`, the long prompts
(`--long-input-len` +/- `--long-range-ratio`, 2048-4096 by default) as a gamma process of
`--long-burstiness` (below 1: bursts) at `--long-rate`, both for `--duration` seconds,
streamed through the same client, run loop and metrics as `accord bench serve`.

Printed per config: the chats' p50 / p99 inter-token latency (the decode stalls a long
prefill causes), the chats' p99 TTFT, the long prompts' p99 TTFT, goodput (requests per
second meeting their class's SLO: `--chat-slo` for chats, `--long-slo` for long
prompts; vLLM's goodput per class, summed) and output tokens per second; with the load
average before and after each run (on a shared host it moves the figures more than the
configs do), and each instance's KV cache in use once the run is over (0%: no block
leaked, the prefill side's kept ones included). `--out-dir` keeps each config's figures (`<config>.json`) and server logs.

Smoke version (a 30 s trace; the figures only show that it runs):

    PYTHONPATH=. python benchmarks/pd_bursty.py --duration 30 --chat-rate 0.5 --long-rate 0.07
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import shlex
import sys
import tempfile
import time
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from prometheus_client.parser import text_string_to_metric_families
from serve_latency import free_port, running

from accord.bench.serve.command import load_tokenizer_for
from accord.bench.serve.datasets import DatasetSpec, sample_requests
from accord.bench.serve.http_session import AiohttpSession
from accord.bench.serve.metrics import compute_metrics, parse_goodput
from accord.bench.serve.request_types import RequestSettings
from accord.bench.serve.runner import RungSpec, run_rung

CONFIGS = ("colocated", "pd")
SERVED_NAME = "pd-bench"
READY_TIMEOUT_S = 600.0
#: Seconds a finished run waits for the instances' KV blocks to be freed before reporting them.
KV_SETTLE_S = 10.0


@dataclass(frozen=True)
class Instance:
    """One process of a config: its command, the cores it is pinned to (None: not
    pinned), its torch threads, its port and its log's name."""

    name: str
    command: list[str]
    port: int
    cores: str | None = None
    threads: int | None = None


def serve_command(args: argparse.Namespace, port: int, kv_transfer: dict | None) -> list[str]:
    """`accord serve` of the bench model on `port`, with a KV connector when given."""
    command = [
        sys.executable, "-m", "accord", "serve", "--model", args.model, "--served-model-name", SERVED_NAME,
        "--port", str(port), "--backend", args.backend, "--max-model-len", str(args.max_model_len),
        "--kv-cache-memory-bytes", str(int(args.kv_cache_gib * (1 << 30))), *shlex.split(args.instance_args),
    ]  # fmt: skip
    if kv_transfer is not None:
        command += ["--kv-transfer-config", json.dumps(kv_transfer)]
    return command


def nixl(role: str) -> dict:
    return {"kv_connector": "NixlConnector", "kv_role": role, "kv_ip": "127.0.0.1", "kv_port": free_port()}


def config_instances(config: str, args: argparse.Namespace) -> list[Instance]:
    """The processes of `config`, the one clients talk to last."""
    if config == "colocated":
        port = free_port()
        return [Instance("colocated", serve_command(args, port, None), port, "0,1", 2)]
    prefill_port, decode_port, router_port = free_port(), free_port(), free_port()
    router = [sys.executable, "-m", "accord", "router", "--prefill", f"http://127.0.0.1:{prefill_port}",
              "--decode", f"http://127.0.0.1:{decode_port}", "--port", str(router_port)]
    return [
        Instance("prefill", serve_command(args, prefill_port, nixl("kv_producer")), prefill_port, "0", 1),
        Instance("decode", serve_command(args, decode_port, nixl("kv_consumer")), decode_port, "1", 1),
        Instance("router", router, router_port),
    ]


@contextlib.contextmanager
def started(instances: list[Instance], out: Path) -> Iterator[str]:
    """Start `instances` in order, each ready (GET /health 200) before the next; yield
    the last one's URL; stop them all on the way out."""
    with contextlib.ExitStack() as stack:
        for instance in instances:
            env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)}
            env.setdefault("UCX_TLS", "tcp")
            env.setdefault("UCX_NET_DEVICES", "lo")
            if instance.threads is not None:
                env["OMP_NUM_THREADS"] = str(instance.threads)
            command = (["taskset", "-c", instance.cores] if instance.cores else []) + instance.command
            stack.enter_context(running(command, env, out / f"{instance.name}.log", instance.port, READY_TIMEOUT_S,
                                        ready_path="/health"))
        yield f"http://127.0.0.1:{instances[-1].port}"


def kv_blocks_held(instances: list[Instance]) -> str:
    """Each engine instance's `vllm:kv_cache_usage_perc` once the run is over, after up
    to KV_SETTLE_S for the prefill side's kept blocks to be released: anything above 0
    is a leak."""
    held = {}
    for instance in instances:
        if instance.name == "router":
            continue
        deadline = time.monotonic() + KV_SETTLE_S
        while True:
            with urllib.request.urlopen(f"http://127.0.0.1:{instance.port}/metrics", timeout=10) as reply:
                families = text_string_to_metric_families(reply.read().decode())
                usage = next(s.value for f in families for s in f.samples if s.name == "vllm:kv_cache_usage_perc")
            if usage == 0 or time.monotonic() > deadline:
                break
            time.sleep(0.2)
        held[instance.name] = usage
    return " ".join(f"{name} {usage:.1%}" for name, usage in held.items())


def load_average() -> str:
    return " ".join(Path("/proc/loadavg").read_text().split()[:3])


async def measure(args: argparse.Namespace, base_url: str) -> dict:
    """One run of the trace against `base_url`: the chats' and long prompts' figures."""
    tokenizer = load_tokenizer_for(args.model, explicit=True)
    chats = DatasetSpec("random", random_input_len=args.chat_input_len, random_output_len=args.chat_output_len,
                        random_range_ratio=0.25)
    longs = DatasetSpec("random", random_input_len=args.long_input_len, random_output_len=args.long_output_len,
                        random_range_ratio=args.long_range_ratio)
    num_chats = max(1, round(args.duration * args.chat_rate))
    num_longs = max(1, round(args.duration * args.long_rate))
    settings = RequestSettings("openai", base_url + "/v1/completions", SERVED_NAME, ignore_eos=True,
                               extra_body={"temperature": 0.0})
    async with AiohttpSession(None, {}) as http:
        warmups = sample_requests(chats, args.num_warmups, tokenizer, args.seed + 1)
        await run_rung(http, settings, [], warmups, RungSpec(1.0, progress=False), base_url)
        chat_run, long_run = await asyncio.gather(
            run_rung(http, settings, sample_requests(chats, num_chats, tokenizer, args.seed), [],
                     RungSpec(args.chat_rate, seed=args.seed, label="chats"), base_url),
            run_rung(http, settings, sample_requests(longs, num_longs, tokenizer, args.seed + 2), [],
                     RungSpec(args.long_rate, args.long_burstiness, seed=args.seed + 3, label="long"), base_url),
        )
    # Both classes started together: the run lasts until the later one's last answer.
    duration = max(chat_run.duration_s, long_run.duration_s)
    return {
        "chats": compute_metrics(chat_run.outcomes, duration, ["ttft", "itl", "tpot"], [50, 99], args.chat_slo),
        "long": compute_metrics(long_run.outcomes, duration, ["ttft", "itl"], [50, 99], args.long_slo),
        "duration_s": duration,
    }


def row(config: str, figures: dict) -> list[str]:
    chats, longs = figures["chats"], figures["long"]
    goodput = ((chats["good_requests"] or 0) + (longs["good_requests"] or 0)) / figures["duration_s"]
    failed = chats["failed"] + longs["failed"]
    return [
        config, f"{chats['median_itl_ms']:.0f}", f"{chats['p99_itl_ms']:.0f}", f"{chats['p99_ttft_ms']:.0f}",
        f"{longs['p99_ttft_ms']:.0f}", f"{goodput:.3f}", f"{chats['output_throughput'] + longs['output_throughput']:.1f}",
        str(failed), figures["kv_held"], figures["load_before"], figures["load_after"],
    ]  # fmt: skip


#: The trace's shape: flag, type, default, what it sets.
TRACE_FLAGS = (
    ("--duration", float, 300.0, "seconds of arrivals in the trace"),
    ("--chat-rate", float, 1.0, "short chats per second (Poisson)"),
    ("--chat-input-len", int, 128, "chat prompt tokens (+/- 25%%)"),
    ("--chat-output-len", int, 64, "chat output tokens (+/- 25%%)"),
    ("--long-rate", float, 0.05, "long prompts per second, on average"),
    ("--long-burstiness", float, 0.1, "gamma shape of the long prompts' arrivals (below 1: bursts)"),
    ("--long-input-len", int, 3072, "long prompt tokens, on average"),
    ("--long-range-ratio", float, 1 / 3, "long prompt lengths: input-len * (1 -/+ this)"),
    ("--long-output-len", int, 16, "long prompts' output tokens (+/- the same ratio)"),
)
HEADER = ["config", "chat ITL p50 ms", "chat ITL p99 ms", "chat TTFT p99 ms", "long TTFT p99 ms", "goodput req/s",
          "out tok/s", "failed", "KV in use after", "load before", "load after"]


def parse_args() -> argparse.Namespace:
    from accord.demo.default_model import default_model_path

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default=None, help="model path (default: the demo model, SmolLM2-135M-Instruct)")
    parser.add_argument("--backend", default="cpu")
    parser.add_argument("--configs", default=",".join(CONFIGS), help="comma-separated, of: " + ", ".join(CONFIGS))
    for flag, kind, default, text in TRACE_FLAGS:
        parser.add_argument(flag, type=kind, default=default, help=f"{text} (default: {default:g})")
    parser.add_argument("--chat-slo", nargs="*", default=["ttft:2000", "tpot:200"], help="KEY:MS pairs for chats")
    parser.add_argument("--long-slo", nargs="*", default=["ttft:60000"], help="KEY:MS pairs for long prompts")
    parser.add_argument("--num-warmups", type=int, default=2, help="chats sent one by one first, in no figure")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--max-model-len", type=int, default=4608)
    parser.add_argument("--kv-cache-gib", type=float, default=1.0, help="KV cache per instance")
    parser.add_argument("--instance-args", default="", help="more `accord serve` flags for every instance")
    parser.add_argument("--out-dir", default=None, help="where figures and logs go (default: a temporary directory)")
    args = parser.parse_args()
    args.model = args.model or str(default_model_path())
    args.chat_slo, args.long_slo = parse_goodput(args.chat_slo), parse_goodput(args.long_slo)
    args.configs = [name.strip() for name in args.configs.split(",") if name.strip()]
    unknown = set(args.configs) - set(CONFIGS)
    if unknown:
        parser.error(f"--configs: unknown {', '.join(sorted(unknown))}; choose from {', '.join(CONFIGS)}")
    return args


def main() -> None:
    args = parse_args()
    out = Path(args.out_dir or tempfile.mkdtemp(prefix="pd-bursty-"))
    out.mkdir(parents=True, exist_ok=True)
    print(f"{args.model}; trace of {args.duration:.0f} s: chats {args.chat_rate}/s ({args.chat_input_len} -> "
          f"{args.chat_output_len} tokens), long prompts {args.long_rate}/s burstiness {args.long_burstiness} "
          f"({args.long_input_len} +/- {args.long_range_ratio:.0%} -> {args.long_output_len}); SLOs: chats "
          f"{args.chat_slo}, long {args.long_slo} (ms); logs and figures in {out}")
    rows = []
    for config in args.configs:
        logs = out / config
        logs.mkdir(exist_ok=True)
        instances = config_instances(config, args)
        with started(instances, logs) as url:
            load_before = load_average()
            figures = asyncio.run(measure(args, url))
            figures |= {"load_before": load_before, "load_after": load_average(), "kv_held": kv_blocks_held(instances)}
        (out / f"{config}.json").write_text(json.dumps(figures, indent=2))
        rows.append(row(config, figures))
    print("| " + " | ".join(HEADER) + " |")
    print("|" + "---|" * len(HEADER))
    for cells in rows:
        print("| " + " | ".join(cells) + " |")


if __name__ == "__main__":
    main()
