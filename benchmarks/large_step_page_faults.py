"""Minor page faults of large offline steps on the cpu backend: 8 prompts of 512 tokens
with 3 output tokens each (one 4096-token prefill step, then two decode steps) on the
152M bench model, generated 3 times after a warm-up call; prints the faults and the
process CPU time per call. Run it with ACCORD_CPU_MALLOC_TUNING=0 and without to see
what the cpu backend's glibc malloc settings (accord/backends/cpu/malloc_tuning.py) save.

    PYTHONPATH=. python benchmarks/large_step_page_faults.py
"""

from __future__ import annotations

import os
import random
import resource
import tempfile
import time
from pathlib import Path

from accord import LLM, SamplingParams
from accord.bench.offline.model import MODEL_SHAPE, build_model

PROMPTS, PROMPT_LEN, CALLS = 8, 512, 3


def main() -> None:
    model = build_model(Path(tempfile.gettempdir()) / "accord-bench-llama-152m")
    llm = LLM(model=str(model), backend="cpu", max_model_len=1024, max_num_seqs=128)
    rng = random.Random(0)

    def batch() -> list[dict[str, list[int]]]:
        return [{"prompt_token_ids": [rng.randrange(3, MODEL_SHAPE["vocab_size"]) for _ in range(PROMPT_LEN)]}
                for _ in range(PROMPTS)]

    params = SamplingParams(temperature=0.0, max_tokens=3, ignore_eos=True)
    llm.generate(batch(), params, use_tqdm=False)  # warm: the first large step's pages are faulted in either way
    before, start = resource.getrusage(resource.RUSAGE_SELF).ru_minflt, time.process_time()
    for _ in range(CALLS):
        llm.generate(batch(), params, use_tqdm=False)
    faults = resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before
    tuning = os.environ.get("ACCORD_CPU_MALLOC_TUNING", "1")
    print(f"ACCORD_CPU_MALLOC_TUNING={tuning}: {faults / CALLS:.0f} minor page faults per call, "
          f"{(time.process_time() - start) / CALLS:.2f} s CPU per call "
          f"(budget {llm.llm_engine.scheduler.max_num_batched_tokens} tokens)")


if __name__ == "__main__":
    main()
