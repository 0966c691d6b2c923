"""What async scheduling (--async-scheduling) hides: decode step time with and without
it, side by side in one process (the same model loaded twice), for batch 1 and a batch
of 32, on a tiny random Llama (host time dominates) and on a model directory you give
(e.g. the 152M bench model). Also the host time of a synchronous step: the step's wall
time minus the time spent in the executor (scheduling, output processing,
detokenisation), i.e. the most async scheduling can hide.

    PYTHONPATH=. python benchmarks/async_scheduling.py [--model DIR ...] [--batch 1 32] [--tokens 64]

Wall time, best of --repeats alternating runs (a shared machine is noisy: compare the
two columns of one run, not runs with each other).
"""

from __future__ import annotations

import argparse
import tempfile
import time
from pathlib import Path

from host_overhead import build


def measure(model_dir: str, batch_sizes: list[int], tokens: int, repeats: int, threads: int | None) -> None:
    """Print one row per batch size: ms per decode step synchronous / async, and the
    synchronous step's host time (outside the executor)."""
    import torch

    from accord import LLM, SamplingParams

    if threads is not None:
        torch.set_num_threads(threads)
    args = dict(backend="cpu", max_model_len=512, max_num_seqs=max(batch_sizes), max_num_batched_tokens=2048)
    engines = {mode: LLM(model=model_dir, async_scheduling=mode == "async", **args) for mode in ("sync", "async")}
    executor = engines["sync"].llm_engine.executor
    in_executor = [0.0]
    real_execute = executor.execute_model

    def timed_execute(steps):
        start = time.perf_counter()
        try:
            return real_execute(steps)
        finally:
            in_executor[0] += time.perf_counter() - start

    executor.execute_model = timed_execute  # type: ignore[method-assign]
    params = SamplingParams(temperature=0.0, max_tokens=tokens, ignore_eos=True)
    print(f"{model_dir}: {torch.get_num_threads()} torch thread(s), {tokens} tokens per request")
    print(f"{'batch':>5} {'sync ms/step':>13} {'async ms/step':>14} {'async/sync':>10} {'sync host ms/step':>18}")
    for batch in batch_sizes:
        prompts = [{"prompt_token_ids": [3 + (i * 7 + j) % 200 for j in range(16)]} for i in range(batch)]
        best = {"sync": float("inf"), "async": float("inf")}
        host = float("inf")
        for llm in engines.values():
            llm.generate(prompts, params, use_tqdm=False)  # warm-up
        for _ in range(repeats):
            for mode, llm in engines.items():
                in_executor[0] = 0.0
                start = time.perf_counter()
                llm.generate(prompts, params, use_tqdm=False)
                seconds = time.perf_counter() - start
                best[mode] = min(best[mode], seconds / tokens)
                if mode == "sync":
                    host = min(host, (seconds - in_executor[0]) / tokens)
        print(f"{batch:>5} {best['sync'] * 1e3:>13.2f} {best['async'] * 1e3:>14.2f} "
              f"{best['async'] / best['sync']:>10.3f} {host * 1e3:>18.2f}")
    for llm in engines.values():
        llm.llm_engine.shutdown()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", nargs="*", default=[], help="model directories (a tiny random Llama always runs)")
    parser.add_argument("--batch", type=int, nargs="+", default=[1, 32])
    parser.add_argument("--tokens", type=int, default=64)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--threads", type=int, default=None, help="torch threads (default: torch's)")
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory() as scratch:
        tiny = build(Path(scratch) / "tiny", layers=4)
        for model in [str(tiny), *args.model]:
            measure(model, args.batch, args.tokens, args.repeats, args.threads)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
