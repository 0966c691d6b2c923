"""accord's side of `accord bench`: the offline `LLM` over every workload, started once."""

from __future__ import annotations

import argparse
import time
from collections.abc import Callable
from pathlib import Path

from .results import EngineRun, Result, Runs, run_label
from .workload import BATCH1, TraceRequest


def run_accord(
    model_dir: Path,
    loads: dict[str, list[list[TraceRequest]]],
    args: argparse.Namespace,
    measure_bandwidth: Callable[[], float] | None = None,
) -> EngineRun:
    """accord's LLM.generate over each run of each workload (one engine, started once);
    with `measure_bandwidth`, the device's copy bandwidth before the first batch-1 run and
    after each."""
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
    print(f"accord ready in {startup:.1f} s", flush=True)
    results: dict[str, Runs] = {}
    decode: list[float] = []
    bandwidth: list[float] = []
    for name, runs in loads.items():
        measured = []
        batch1 = name == BATCH1
        for index, trace in enumerate(runs):
            prompts = [{"prompt_token_ids": r.prompt_token_ids} for r in trace]
            params = [SamplingParams(temperature=0.0, max_tokens=r.output_len, ignore_eos=True) for r in trace]
            # Each batch-1 run is held to the memory bandwidth of the same minute: on a
            # shared host it drifts (13-16 GB/s between runs here), so it is measured on
            # both sides of every run (the copy after one run is the one before the next).
            if batch1 and measure_bandwidth and not bandwidth:
                bandwidth.append(measure_bandwidth())
            start = time.perf_counter()
            outputs = llm.generate(prompts, params, use_tqdm=True)
            seconds = time.perf_counter() - start
            measured.append(Result("accord", len(trace), sum(len(o.outputs[0].token_ids) for o in outputs), seconds))
            label = run_label(index, len(runs))
            print(f"accord {name}{label}: {measured[-1].output_tokens_per_s:.1f} out tok/s", flush=True)
            if batch1:
                times = outputs[0].metrics
                decode.append((trace[0].output_len - 1) / (times.finished_time - times.first_token_time))
                if measure_bandwidth:
                    bandwidth.append(measure_bandwidth())
        results[name] = Runs(tuple(measured))
    return EngineRun(startup, results, tuple(decode), tuple(bandwidth))
