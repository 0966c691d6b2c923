"""GGUF files computed packed (quant_linear) against the same files dequantised at load,
side by side in one run, and llama.cpp on the same files where its binaries are given:
batch-1 decode (a 128-token prompt, 128 new tokens) and 32 x 128 -> 128, output tok/s,
and the peak RSS of each batch-1 process.

    python benchmarks/quant_gguf_cpu.py [--model FILE ...] [--threads 2]
        [--llama-bench PATH] [--llama-batched-bench PATH]

Each measurement runs in a process of its own (so its peak RSS is its own): accord's
with `ACCORD_GGUF_PACKED` 1 (packed) or 0 (dequantised), llama.cpp's
`llama-bench -p 0 -n 128` (batch-1 decode) and `llama-batched-bench -npp 128 -ntg 128
-npl 32`. The default model is the demo's SmolLM2-135M-Instruct Q4_1 file. On a shared
machine compare the ratios of one run, not absolute rates across runs.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

PROMPT_TOKENS, NEW_TOKENS, BATCH = 128, 128, 32
MODES = {"packed": "1", "dequantised": "0"}


def _prompts(count: int, vocab: int) -> list[dict]:
    return [{"prompt_token_ids": [100 + (i * 131 + j * 7) % (vocab - 200) for j in range(PROMPT_TOKENS)]}
            for i in range(count)]


def measure(model: str, workload: str, threads: int) -> dict:
    """Run one workload in this process: {"tok_s": output tokens per second}."""
    import torch

    from accord import LLM, SamplingParams

    torch.set_num_threads(threads)
    batch = 1 if workload == "batch1" else BATCH
    llm = LLM(model, backend="cpu", max_model_len=PROMPT_TOKENS + NEW_TOKENS, max_num_seqs=batch,
              max_num_batched_tokens=max(512, PROMPT_TOKENS * 4),
              num_gpu_blocks_override=batch * (PROMPT_TOKENS + NEW_TOKENS) // 16 + 8)
    vocab = llm.llm_engine.model_config.vocab_size

    def run(count: int, tokens: int) -> float:
        params = SamplingParams(temperature=0.0, max_tokens=tokens, ignore_eos=True)
        start = time.perf_counter()
        llm.generate(_prompts(count, vocab), params, use_tqdm=False)
        return time.perf_counter() - start

    run(1, 8)  # warm-up: builds, first-sight validation, graph capture
    if workload == "batch1":
        # Decode only: the 128-token run less a prefill-and-one-token run.
        prefill = min(run(1, 1) for _ in range(2))
        return {"tok_s": (NEW_TOKENS - 1) / (run(1, NEW_TOKENS) - prefill)}
    return {"tok_s": BATCH * NEW_TOKENS / run(BATCH, NEW_TOKENS)}


def _child(command: list[str], env: dict[str, str]) -> tuple[str, float]:
    """(stdout, peak RSS in MB) of a child process (its own rusage, from wait4)."""
    with tempfile.TemporaryFile("w+") as out, tempfile.TemporaryFile("w+") as err:
        process = subprocess.Popen(command, stdout=out, stderr=err, env=env, text=True)
        _, status, usage = os.wait4(process.pid, 0)
        process.returncode = os.waitstatus_to_exitcode(status)
        out.seek(0), err.seek(0)
        if process.returncode:
            raise RuntimeError(f"{command[0]} failed ({process.returncode}): {err.read()[-2000:]}")
        return out.read(), usage.ru_maxrss / 1024


def accord_run(model: str, mode: str, workload: str, threads: int) -> tuple[float, float]:
    env = {**os.environ, "ACCORD_GGUF_PACKED": MODES[mode], "OMP_NUM_THREADS": str(threads)}
    stdout, peak = _child([sys.executable, __file__, "--child", workload, "--threads", str(threads), model], env)
    return json.loads(stdout.strip().splitlines()[-1])["tok_s"], peak


def llama_bench(binary: str, model: str, threads: int) -> tuple[float, float]:
    stdout, peak = _child([binary, "-m", model, "-t", str(threads), "-p", "0", "-n", str(NEW_TOKENS), "-o", "json"],
                          dict(os.environ))
    return json.loads(stdout)[0]["avg_ts"], peak


def llama_batched(binary: str, model: str, threads: int) -> float:
    context = BATCH * (PROMPT_TOKENS + NEW_TOKENS)
    stdout, _ = _child([binary, "-m", model, "-t", str(threads), "-c", str(context), "-b", "2048", "-ub", "512",
                        "-npp", str(PROMPT_TOKENS), "-ntg", str(NEW_TOKENS), "-npl", str(BATCH), "--output-format", "jsonl"],
                       dict(os.environ))
    row = json.loads(stdout.strip().splitlines()[-1])
    return BATCH * NEW_TOKENS / row["t_tg"] if "t_tg" in row else row["speed_tg"]


def main() -> None:
    """Print one table row per file and engine."""
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", action="append", help="a GGUF file (repeatable; default: the demo's SmolLM2 Q4_1)")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--llama-bench", help="llama.cpp's llama-bench binary (skipped when absent)")
    parser.add_argument("--llama-batched-bench", help="llama.cpp's llama-batched-bench binary (skipped when absent)")
    parser.add_argument("--child", choices=("batch1", "batch32"), help=argparse.SUPPRESS)
    parser.add_argument("child_model", nargs="?", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        print(json.dumps(measure(args.child_model, args.child, args.threads)))
        return
    if not args.model:
        from accord.demo.default_model import default_model_path

        args.model = [str(default_model_path())]
    print(f"threads {args.threads}; batch-1: {PROMPT_TOKENS} -> {NEW_TOKENS} decode tok/s; "
          f"batched: {BATCH} x {PROMPT_TOKENS} -> {NEW_TOKENS} output tok/s; RSS: batch-1 process peak")
    print(f"{'file':44} {'engine':18} {'batch-1 tok/s':>13} {'batch-1 RSS MB':>15} {'32x tok/s':>10}")
    for model in args.model:
        name = Path(model).name
        for mode in MODES:
            rate1, peak = accord_run(model, mode, "batch1", args.threads)
            rate32, _ = accord_run(model, mode, "batch32", args.threads)
            print(f"{name:44} {'accord ' + mode:18} {rate1:13.1f} {peak:15.0f} {rate32:10.1f}", flush=True)
        if args.llama_bench and Path(args.llama_bench).is_file():
            rate1, peak = llama_bench(args.llama_bench, model, args.threads)
            rate32 = float("nan")
            if args.llama_batched_bench and Path(args.llama_batched_bench).is_file():
                rate32 = llama_batched(args.llama_batched_bench, model, args.threads)
            print(f"{name:44} {'llama.cpp':18} {rate1:13.1f} {peak:15.0f} {rate32:10.1f}", flush=True)
        else:
            print(f"{name:44} llama.cpp skipped: no --llama-bench binary given or found", flush=True)


if __name__ == "__main__":
    main()
