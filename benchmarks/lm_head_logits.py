"""The cost of fp32 logits: a bf16 model's LM head with a bf16 output widened afterwards
(before: `linear` then `.float()`) against the head with an fp32 output (after:
`linear(..., out_dtype=fp32)`), side by side in one process on the cpu backend.

    ACCORD_CPU_BF16_PATH=native python benchmarks/lm_head_logits.py [--model PATH] [--rounds 15] [--engine]

Default model: accord serve's, SmolLM2-135M-Instruct (its head is 49152 x 576, tied to
the embedding), loaded in bf16. Per row count (1 and 32) the median over `rounds` of
the mean of 10 head calls, the two forms alternating so a busy host's drift hits both.
`--engine` also runs the engine (one thread: on a busy 2-core host OpenMP's two-thread
GEMMs stall) with its head switched between the two forms round by round, and the same
model in fp32: decode tokens/s at batch 1 (32 new tokens) and batch 32 (8 new tokens).
"""

from __future__ import annotations

import argparse
import statistics
import time
from typing import Callable

import torch


def head_calls(model: str, rounds: int) -> None:
    from accord.backends import get_backend
    from accord.core.model_loader.load import load_model
    from accord.op_contracts import OpDispatcher

    backend = get_backend("cpu")
    ops = OpDispatcher(backend)
    loaded = load_model(model, ops, dtype="bfloat16", compute_dtype=backend.compute_dtype)
    weight, linear = loaded.model.head.local.weight, ops.linear
    forms: dict[str, Callable[[torch.Tensor], torch.Tensor]] = {
        "before": lambda x: linear(x, weight, None).float(),
        "after": lambda x: linear(x, weight, None, torch.float32),
    }
    print(f"model dtype {loaded.config.dtype}, {torch.get_num_threads()} threads")
    for rows in (1, 32):
        x = torch.randn(rows, loaded.config.hidden_size).to(loaded.config.dtype)
        times: dict[str, list[float]] = {name: [] for name in forms}
        for _ in range(rounds):
            for name, form in forms.items():
                form(x)
                start = time.perf_counter()
                for _ in range(10):
                    form(x)
                times[name].append((time.perf_counter() - start) / 10 * 1e3)
        medians = {name: statistics.median(values) for name, values in times.items()}
        print(f"rows {rows:2d}: head before {medians['before']:.2f} ms, after {medians['after']:.2f} ms")


def engine_runs(model: str, rounds: int) -> None:
    from accord import LLM, SamplingParams

    torch.set_num_threads(1)
    engines = {dtype: LLM(model=model, backend="cpu", dtype=dtype) for dtype in ("bfloat16", "float32")}
    head = engines["bfloat16"].llm_engine.executor.driver_worker.runner.model.head
    variants = (("bf16 before", "bfloat16", None), ("bf16 after", "bfloat16", torch.float32), ("fp32", "float32", None))
    call = type(head).__call__
    # "before" hands the sampler bf16 logits widened, as the head did; a no-op on fp32 ones.
    type(head).__call__ = lambda self, hidden: call(self, hidden).float()
    rates: dict[tuple[str, int], list[float]] = {(name, batch): [] for name, _, _ in variants for batch in (1, 32)}
    for round_ in range(rounds):
        for batch, tokens in ((1, 32), (32, 8)):
            for name, dtype, out_dtype in variants:
                if dtype == "bfloat16":
                    head.local.out_dtype = out_dtype
                prompts = [f"Write a long story about a cat who travels the world. {round_}.{i}" for i in range(batch)]
                params = SamplingParams(temperature=0, max_tokens=tokens, ignore_eos=True)
                start = time.perf_counter()
                outputs = engines[dtype].generate(prompts, params, use_tqdm=False)
                generated = sum(len(output.outputs[0].token_ids) for output in outputs)
                rates[(name, batch)].append(generated / (time.perf_counter() - start))
    for (name, batch), values in rates.items():
        runs = ", ".join(f"{v:.1f}" for v in values)
        print(f"batch {batch:2d} {name:11s}: median {statistics.median(values):6.1f} tok/s ({runs})")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", help="a GGUF file or Hugging Face directory (default: the default model)")
    parser.add_argument("--rounds", type=int, default=15)
    parser.add_argument("--engine", action="store_true", help="also measure engine decode throughput")
    args = parser.parse_args()
    if args.model is None:
        from accord.demo.default_model import default_model_path

        args.model = str(default_model_path())
    head_calls(args.model, args.rounds)
    if args.engine:
        engine_runs(args.model, max(1, args.rounds // 5))


if __name__ == "__main__":
    main()
