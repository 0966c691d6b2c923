"""Core-to-worker overhead at steady-state decode (issue 10's measurements):

1. bytes of the pickled SchedulerOutput per step at batch 64 (what the mp executor
   sends every worker each step), and
2. per-step time of the `mp` executor (worker processes, pipes) against `uni` (in
   process) on the same tiny model and workload, side by side in one run, and the
   round trip of an empty step (the executor's own cost without the model).

    PYTHONPATH=$PWD python benchmarks/executor_overhead.py [--model DIR] [--batch 64]
        [--decode-steps 32] [--tp 2] [--threads 1]

The model defaults to the built-in demo model (random weights). On a shared machine
the absolute times are noisy; the ratio of the side-by-side runs is the figure.
"""

from __future__ import annotations

import argparse
import os
import pickle
import statistics
import time

import torch

from accord import LLM, SamplingParams
from accord.core.sched.output import CachedRequestData, SchedulerOutput
from accord.demo.model import demo_model_dir

#: Empty steps timed to isolate the executor's own cost (dispatch, pickling, pipes).
EMPTY_STEPS = 200


def measure(model: str, batch: int, decode_steps: int, **engine_args) -> dict[str, float]:
    """Run `batch` requests to `decode_steps` tokens; time every step once all are
    decoding, and pickle every step's SchedulerOutput."""
    llm = LLM(model, backend="cpu", max_model_len=512, max_num_seqs=batch, num_gpu_blocks_override=batch * 8,
              max_num_batched_tokens=max(2048, batch * 32), **engine_args)
    engine = llm.llm_engine
    try:
        steps: list[tuple[float, int, bool]] = []
        real_execute = engine.executor.execute_model

        def timed_execute(step):
            start = time.perf_counter()
            result = real_execute(step)
            steady = not step.scheduled_new_reqs and len(step.num_scheduled_tokens) == batch
            steps.append((time.perf_counter() - start, len(pickle.dumps(step)), steady))
            return result

        engine.executor.execute_model = timed_execute  # type: ignore[method-assign]
        generator = torch.Generator().manual_seed(0)
        prompts = [{"prompt_token_ids": torch.randint(0, 500, (32,), generator=generator).tolist()} for _ in range(batch)]
        params = SamplingParams(temperature=0.0, max_tokens=decode_steps, ignore_eos=True)
        start = time.perf_counter()
        llm.generate(prompts, params, use_tqdm=False)
        total = time.perf_counter() - start
        empty = SchedulerOutput([], CachedRequestData(), {})
        round_trips = []
        for _ in range(EMPTY_STEPS):
            begin = time.perf_counter()
            real_execute(empty)
            round_trips.append(time.perf_counter() - begin)
    finally:
        engine.shutdown()
    steady = [(seconds, size) for seconds, size, is_steady in steps if is_steady]
    return {
        "steady_steps": len(steady),
        "step_ms_median": 1e3 * statistics.median(s for s, _ in steady),
        "step_ms_mean": 1e3 * statistics.mean(s for s, _ in steady),
        "pickled_bytes_median": statistics.median(b for _, b in steady),
        "pickled_bytes_max": max(b for _, b in steady),
        "empty_step_ms_median": 1e3 * statistics.median(round_trips),
        "total_s": total,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default=None, help="model directory (default: the demo model)")
    parser.add_argument("--batch", type=int, default=64)
    parser.add_argument("--decode-steps", type=int, default=32)
    parser.add_argument("--tp", type=int, default=2, help="also measure mp with this many ranks (0: skip)")
    parser.add_argument(
        "--threads", type=int, default=1, help="torch threads per rank, in process and in workers (default: 1)"
    )
    args = parser.parse_args()
    # Same threads for every rank wherever it runs: spawned workers read OMP_NUM_THREADS.
    os.environ["OMP_NUM_THREADS"] = str(args.threads)
    torch.set_num_threads(args.threads)
    model = args.model or str(demo_model_dir())
    runs = {
        "uni": dict(distributed_executor_backend="uni"),
        "mp tp=1": dict(distributed_executor_backend="mp"),
    }
    if args.tp > 1:
        runs[f"mp tp={args.tp}"] = dict(distributed_executor_backend="mp", tensor_parallel_size=args.tp)
    results = {name: measure(model, args.batch, args.decode_steps, **engine_args) for name, engine_args in runs.items()}
    print(f"steady decode, batch {args.batch}, {args.decode_steps} tokens each, model {model}")
    print(f"{'executor':<10} {'steps':>6} {'step ms (median)':>17} {'step ms (mean)':>15} "
          f"{'empty step ms':>14} {'pickled B (median/max)':>23}")
    for name, r in results.items():
        print(f"{name:<10} {r['steady_steps']:>6} {r['step_ms_median']:>17.2f} {r['step_ms_mean']:>15.2f} "
              f"{r['empty_step_ms_median']:>14.3f} {r['pickled_bytes_median']:>11.0f} / {r['pickled_bytes_max']:<9.0f}")
    uni = results["uni"]["step_ms_median"]
    mp = results["mp tp=1"]["step_ms_median"]
    print(f"mp (tp=1) per-step overhead vs uni: {mp - uni:+.2f} ms ({mp / uni:.2f}x)")


if __name__ == "__main__":
    main()
