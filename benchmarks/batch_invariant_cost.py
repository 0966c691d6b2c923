"""What `--batch-invariant` costs: greedy decode tokens/s at batch 1 and 32, mode off
and on, on one model (default: the built-in random demo model) in bf16 on the cpu
backend. Also counts, per mode, the streams whose text differs from the same prompt's
batch-1 text (the mode's point: 0 when on).

    python benchmarks/batch_invariant_cost.py [--model accord-demo-random] [--tokens 32]
"""

from __future__ import annotations

import argparse
import time

from accord import LLM, SamplingParams

PROMPTS = ["The capital of France is", "One two three four five", "In a hole in the ground there lived",
           "def fibonacci(n):"]


def run(model: str, batch_invariant: bool, tokens: int) -> dict[str, float]:
    """tokens/s at batch 1 and 32, and the batch-32 streams whose text differs from batch 1's."""
    llm = LLM(model, backend="cpu", dtype="bfloat16", batch_invariant=batch_invariant, max_num_seqs=32)
    params = SamplingParams(temperature=0.0, max_tokens=tokens, ignore_eos=True)
    try:
        llm.generate(PROMPTS[:1], params, use_tqdm=False)  # warm-up (native builds, graphs)
        figures, alone = {}, {}
        for batch in (1, 32):
            prompts = [PROMPTS[i % len(PROMPTS)] for i in range(batch)] if batch > 1 else PROMPTS[:1]
            started = time.perf_counter()
            outputs = llm.generate(prompts, params, use_tqdm=False)
            figures[f"batch {batch} tokens/s"] = batch * tokens / (time.perf_counter() - started)
            if batch == 1:
                alone = {p: llm.generate([p], params, use_tqdm=False)[0].outputs[0].text for p in PROMPTS}
            else:
                figures["mismatched streams"] = sum(o.outputs[0].text != alone[p] for p, o in zip(prompts, outputs))
        return figures
    finally:
        llm.llm_engine.shutdown()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="accord-demo-random")
    parser.add_argument("--tokens", type=int, default=32)
    args = parser.parse_args()
    for mode in (False, True):
        figures = run(args.model, mode, args.tokens)
        print(f"batch_invariant={'on' if mode else 'off'}: " + ", ".join(f"{k} {v:.1f}" for k, v in figures.items()))


if __name__ == "__main__":
    main()
