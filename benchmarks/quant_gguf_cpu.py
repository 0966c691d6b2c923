"""GGUF files computed packed (quant_linear) against the same files dequantised at load,
side by side in one run, and llama.cpp on the same files where its binaries are given:
batch-1 decode (a 128-token prompt, 128 new tokens), 32 x 128 -> 128 (output tok/s) and
a 512-token prefill (prompt tok/s), and the peak RSS of each batch-1 process.

    python benchmarks/quant_gguf_cpu.py [--model FILE ...] [--threads 2]
        [--llama-bench PATH] [--llama-batched-bench PATH]

Each measurement runs in a process of its own (so its peak RSS is its own): accord's
with `ACCORD_GGUF_PACKED` 1 (packed) or 0 (dequantised), llama.cpp's
`llama-bench -p 512 -n 128` (pp512 and batch-1 decode tg128) and `llama-batched-bench
-npp 128 -ntg 128 -npl 32`. The default model is the demo's SmolLM2-135M-Instruct Q4_1 file. On a shared
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

from accord._openmp_wait import peer_environment

PROMPT_TOKENS, NEW_TOKENS, BATCH, PREFILL_TOKENS = 128, 128, 32, 512
WORKLOADS = ("batch1", "batch32", "prefill")
MODES = {"packed": "1", "dequantised": "0"}


def _prompts(count: int, vocab: int, length: int = PROMPT_TOKENS) -> list[dict]:
    return [{"prompt_token_ids": [100 + (i * 131 + j * 7) % (vocab - 200) for j in range(length)]}
            for i in range(count)]


def measure(model: str, workload: str, threads: int) -> dict:
    """Run one workload in this process: {"tok_s": output (prefill: prompt) tokens per second}."""
    import torch

    from accord import LLM, SamplingParams

    torch.set_num_threads(threads)
    batch = BATCH if workload == "batch32" else 1
    length = PREFILL_TOKENS if workload == "prefill" else PROMPT_TOKENS
    llm = LLM(model, backend="cpu", max_model_len=length + NEW_TOKENS, max_num_seqs=batch,
              max_num_batched_tokens=max(PREFILL_TOKENS, PROMPT_TOKENS * 4),
              num_gpu_blocks_override=batch * (length + NEW_TOKENS) // 16 + 8,
              # Every run computes its whole prompt (the runs repeat their prompts).
              enable_prefix_caching=False)
    vocab = llm.llm_engine.model_config.vocab_size

    def run(count: int, tokens: int, prompt: int = PROMPT_TOKENS) -> float:
        params = SamplingParams(temperature=0.0, max_tokens=tokens, ignore_eos=True)
        start = time.perf_counter()
        llm.generate(_prompts(count, vocab, prompt), params, use_tqdm=False)
        return time.perf_counter() - start

    run(1, 8)  # warm-up: builds, first-sight validation, graph capture
    if workload == "prefill":
        return {"tok_s": PREFILL_TOKENS / min(run(1, 1, PREFILL_TOKENS) for _ in range(3))}
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


def llama_bench(binary: str, model: str, threads: int) -> tuple[float, float, float]:
    """(tg128 tok/s, pp512 tok/s, peak RSS MB) of one llama-bench process."""
    stdout, peak = _child([binary, "-m", model, "-t", str(threads), "-p", str(PREFILL_TOKENS), "-n", str(NEW_TOKENS),
                           "-o", "json"], peer_environment())
    rates = {(row["n_prompt"], row["n_gen"]): row["avg_ts"] for row in json.loads(stdout)}
    return rates[(0, NEW_TOKENS)], rates[(PREFILL_TOKENS, 0)], peak


def llama_batched(binary: str, model: str, threads: int) -> float:
    context = BATCH * (PROMPT_TOKENS + NEW_TOKENS)
    stdout, _ = _child([binary, "-m", model, "-t", str(threads), "-c", str(context), "-b", "2048", "-ub", "512",
                        "-npp", str(PROMPT_TOKENS), "-ntg", str(NEW_TOKENS), "-npl", str(BATCH), "--output-format", "jsonl"],
                       peer_environment())
    row = json.loads(stdout.strip().splitlines()[-1])
    return BATCH * NEW_TOKENS / row["t_tg"] if "t_tg" in row else row["speed_tg"]


def main() -> None:
    """Print one table row per file, engine and round."""
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", action="append", help="a GGUF file (repeatable; default: the demo's SmolLM2 Q4_1)")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--rounds", type=int, default=1, help="times to run the engines, alternating")
    parser.add_argument("--workloads", default=",".join(WORKLOADS),
                        help=f"comma-separated, of {', '.join(WORKLOADS)} (the others print nan)")
    parser.add_argument("--llama-bench", help="llama.cpp's llama-bench binary (skipped when absent)")
    parser.add_argument("--llama-batched-bench", help="llama.cpp's llama-batched-bench binary (skipped when absent)")
    parser.add_argument("--child", choices=WORKLOADS, help=argparse.SUPPRESS)
    parser.add_argument("child_model", nargs="?", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        print(json.dumps(measure(args.child_model, args.child, args.threads)))
        return
    if not args.model:
        from accord.demo.default_model import default_model_path

        args.model = [str(default_model_path())]
    wanted = set(args.workloads.split(","))
    print(f"threads {args.threads}; batch-1: {PROMPT_TOKENS} -> {NEW_TOKENS} decode tok/s; "
          f"batched: {BATCH} x {PROMPT_TOKENS} -> {NEW_TOKENS} output tok/s; prefill: {PREFILL_TOKENS}-token prompt "
          "tok/s; RSS: batch-1 process peak; load: the 1-minute load average as the row ends")
    print(f"{'file':40} {'engine':18} {'batch-1':>8} {'RSS MB':>7} {'32x':>7} {'pp512':>7} {'load':>5}")
    for model in args.model:
        name = Path(model).name
        for _ in range(args.rounds):
            for mode in MODES:
                rates = {workload: accord_run(model, mode, workload, args.threads) if workload in wanted
                         else (float("nan"), float("nan")) for workload in WORKLOADS}
                _row(name, f"accord {mode}", rates["batch1"][0], rates["batch1"][1], rates["batch32"][0],
                     rates["prefill"][0])
            if args.llama_bench and Path(args.llama_bench).is_file():
                rate1, prefill, peak = llama_bench(args.llama_bench, model, args.threads)
                rate32 = float("nan")
                if "batch32" in wanted and args.llama_batched_bench and Path(args.llama_batched_bench).is_file():
                    rate32 = llama_batched(args.llama_batched_bench, model, args.threads)
                _row(name, "llama.cpp", rate1, peak, rate32, prefill)
            else:
                print(f"{name:40} llama.cpp skipped: no --llama-bench binary given or found", flush=True)


def _row(name: str, engine: str, rate1: float, peak: float, rate32: float, prefill: float) -> None:
    print(f"{name:40} {engine:18} {rate1:8.1f} {peak:7.0f} {rate32:7.1f} {prefill:7.1f} {os.getloadavg()[0]:5.1f}",
          flush=True)


if __name__ == "__main__":
    main()
