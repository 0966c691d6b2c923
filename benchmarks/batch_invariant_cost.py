"""What `--batch-invariant` costs and what it buys: greedy decode tokens/s at batch 1
and 32, mode off and on, on one model (default: the built-in random demo model) in bf16
on the cpu backend; and, per mode, how many of `--streams` greedy streams (13 distinct
prompts dealt round-robin into batches of 32) have text that differs from the same
prompt's text generated alone (the mode's point: 0 when on).

    python benchmarks/batch_invariant_cost.py [--model accord-demo-random] [--tokens 32] [--streams 32]
"""

from __future__ import annotations

import argparse
import time

from accord import LLM, SamplingParams

PROMPTS = [
    "The capital of France is", "One two three four five", "In a hole in the ground there lived",
    "def fibonacci(n):", "Write a haiku about the sea.", "The three laws of motion are",
    "SELECT name FROM users WHERE", "Once upon a time, in a kingdom far away,", "The best way to learn a language is",
    "import numpy as np\n", "Q: What is 17 times 23?\nA:", "Dear hiring manager,", "The mitochondria is",
]
BATCH = 32


def run(model: str, batch_invariant: bool, tokens: int, streams: int) -> dict[str, float]:
    """tokens/s at batch 1 and 32, and the streams whose text differs from their prompt's alone."""
    llm = LLM(model, backend="cpu", dtype="bfloat16", batch_invariant=batch_invariant, max_num_seqs=BATCH)
    params = SamplingParams(temperature=0.0, max_tokens=tokens, ignore_eos=True)
    try:
        llm.generate(PROMPTS[:1], params, use_tqdm=False)  # warm-up (native builds, graphs)
        started = time.perf_counter()
        alone = {p: llm.generate([p], params, use_tqdm=False)[0].outputs[0].text for p in PROMPTS}
        figures = {"batch 1 tokens/s": len(PROMPTS) * tokens / (time.perf_counter() - started)}
        mismatched = generated = 0
        started = time.perf_counter()
        for first in range(0, streams, BATCH):
            prompts = [PROMPTS[i % len(PROMPTS)] for i in range(first, min(first + BATCH, streams))]
            outputs = llm.generate(prompts, params, use_tqdm=False)
            mismatched += sum(o.outputs[0].text != alone[p] for p, o in zip(prompts, outputs))
            generated += len(prompts) * tokens
        figures[f"batch {BATCH} tokens/s"] = generated / (time.perf_counter() - started)
        figures["mismatched streams"] = mismatched
        return figures
    finally:
        llm.llm_engine.shutdown()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="accord-demo-random")
    parser.add_argument("--tokens", type=int, default=32)
    parser.add_argument("--streams", type=int, default=BATCH, help="greedy streams in batches of 32")
    args = parser.parse_args()
    for mode in (False, True):
        figures = run(args.model, mode, args.tokens, args.streams)
        print(f"batch_invariant={'on' if mode else 'off'}: " + ", ".join(f"{k} {v:.1f}" for k, v in figures.items())
              + f" of {args.streams}", flush=True)


if __name__ == "__main__":
    main()
