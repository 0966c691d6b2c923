"""Time to final answer per effort lane under `--scheduling-policy fcfs` and `effort`,
on a seeded trace of mixed efforts arriving at a fixed rate (Poisson), through the
async engine (AsyncLLM, the server's engine front) on a tiny random Llama.

Every request thinks for exactly its effort's budget (the end marker is biased away,
so the budget is what ends the thinking), then answers `--answer-tokens` tokens: its
decode length is known, which is what the effort policy schedules by.

    PYTHONPATH=. python benchmarks/reasoning_effort.py [--requests 120] [--rate 12] \\
        [--budgets low=16,medium=96,high=400] [--mix 0.8,0.15,0.05] [--max-num-seqs 8] [--lane-bounds 64,256] \\
        [--repeats 3]

Prints, per policy and lane, the mean and p99 seconds from arrival to the last answer
token, the whole run's output tokens per second (the two policies must do the same
work at about the same throughput for the latency comparison to mean anything), and
goodput: requests per second that met their effort's SLO on time to the final answer
(`--slo-ms low=1000,...`; vLLM's goodput with an e2el SLO, per effort). With
`--repeats N` the policies run N times each, alternating in ABBA order, and every figure
is the median of its N runs, so that other load on a shared host hits both policies alike.
"""

from __future__ import annotations

import argparse
import asyncio
import random
import statistics
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

import torch
from host_overhead import TINY, build

EFFORTS = ("low", "medium", "high")
#: Two ids of the word-level vocabulary act as the thinking markers.
START_ID, END_ID = 5, 6


@dataclass(frozen=True)
class TracedRequest:
    """One request of the trace: when it arrives (seconds from the start) and its effort."""

    arrival: float
    effort: str
    prompt: list[int]


def trace(count: int, rate: float, mix: list[float], seed: int) -> list[TracedRequest]:
    """`count` requests with Poisson arrivals at `rate` per second, efforts drawn by `mix`."""
    rng = random.Random(seed)
    clock, requests = 0.0, []
    for _ in range(count):
        clock += rng.expovariate(rate)
        prompt = [rng.randrange(10, TINY["vocab_size"]) for _ in range(16)] + [START_ID]
        requests.append(TracedRequest(clock, rng.choices(EFFORTS, mix)[0], prompt))
    return requests


async def replay(model_dir: Path, policy: str, requests: list[TracedRequest], budgets: dict[str, int],
                 answer_tokens: int, max_num_seqs: int, lane_bounds: str) -> tuple[dict[str, list[float]], float, float]:
    """Run the trace; returns seconds to the final answer per effort, output tokens/s,
    and the run's seconds."""
    from accord import AsyncLLM, SamplingParams
    from accord.core.thinking import ThinkingMarkers

    engine = AsyncLLM.from_engine_args(str(model_dir), backend="cpu", max_model_len=512, max_num_seqs=max_num_seqs,
                                       max_num_batched_tokens=1024, scheduling_policy=policy,
                                       effort_lane_bounds=lane_bounds)
    markers = ThinkingMarkers(START_ID, END_ID)
    latencies: dict[str, list[float]] = {effort: [] for effort in EFFORTS}
    tokens = [0]

    async def one(index: int, request: TracedRequest, start: float) -> None:
        await asyncio.sleep(max(0.0, start + request.arrival - time.perf_counter()))
        arrived = time.perf_counter()
        params = SamplingParams(temperature=0.0, ignore_eos=True, max_tokens=answer_tokens, logit_bias={END_ID: -100},
                                thinking_markers=markers, thinking_token_budget=budgets[request.effort])
        async for output in engine.generate({"prompt_token_ids": request.prompt}, params, f"{policy}-{index}"):
            last = output
        tokens[0] += len(last.outputs[0].token_ids)
        latencies[request.effort].append(time.perf_counter() - arrived)

    warm = SamplingParams(max_tokens=4, ignore_eos=True)
    async for _ in engine.generate({"prompt_token_ids": [7] * 8}, warm, f"{policy}-warm"):
        pass
    start = time.perf_counter()
    await asyncio.gather(*(one(i, r, start) for i, r in enumerate(requests)))
    elapsed = time.perf_counter() - start
    await engine.shutdown()
    return latencies, tokens[0] / elapsed, elapsed


@dataclass(frozen=True)
class Summary:
    """One policy's figures, each the median over its runs."""

    #: Per effort with requests: mean and p99 seconds to the final answer.
    lanes: dict[str, tuple[float, float]]
    throughput: float
    goodput: float


def summarise(runs: list[tuple[dict[str, list[float]], float, float]], slos: dict[str, float]) -> Summary:
    """The medians of `replay`'s results over runs; goodput counts requests within their effort's SLO."""
    lanes = {effort: (statistics.median(statistics.mean(latencies[effort]) for latencies, _, _ in runs),
                      statistics.median(p99(latencies[effort]) for latencies, _, _ in runs))
             for effort in EFFORTS if runs[0][0][effort]}
    goodput = statistics.median(sum(value <= slos[effort] for effort in EFFORTS for value in latencies[effort])
                                / elapsed for latencies, _, elapsed in runs)
    return Summary(lanes, statistics.median(throughput for _, throughput, _ in runs), goodput)


def p99(values: list[float]) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(0.99 * (len(ordered) - 1)))]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--requests", type=int, default=120)
    parser.add_argument("--rate", type=float, default=12.0, help="arrivals per second")
    parser.add_argument("--budgets", default="low=16,medium=96,high=400")
    parser.add_argument("--mix", default="0.8,0.15,0.05", help="shares of low, medium, high")
    parser.add_argument("--answer-tokens", type=int, default=16)
    parser.add_argument("--max-num-seqs", type=int, default=8)
    parser.add_argument("--lane-bounds", default="64,256",
                        help="--effort-lane-bounds: with the default budgets, one lane per effort (default: %(default)s)")
    parser.add_argument("--slo-ms", default="low=1000,medium=3000,high=10000",
                        help="goodput's SLO on time to the final answer, per effort (default: %(default)s)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--repeats", type=int, default=1, help="runs per policy, alternating; medians (default: 1)")
    parser.add_argument("--threads", type=int, default=1, help="torch threads (default: 1)")
    parser.add_argument("--model", type=Path, default=None, help="a model directory (default: a tiny random Llama)")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    budgets = {effort: int(value) for effort, value in (item.split("=") for item in args.budgets.split(","))}
    requests = trace(args.requests, args.rate, [float(share) for share in args.mix.split(",")], args.seed)
    model_dir = args.model or build(Path(tempfile.mkdtemp()) / "tiny", layers=2, dtype=torch.float32)
    counts = {effort: sum(r.effort == effort for r in requests) for effort in EFFORTS}
    print(f"{args.requests} requests at {args.rate}/s (seed {args.seed}): {counts}; budgets {budgets}, "
          f"{args.answer_tokens} answer tokens, max_num_seqs {args.max_num_seqs}, effort lanes {args.lane_bounds}, "
          f"{args.threads} torch thread(s)")
    slos = {effort: float(value) / 1000 for effort, value in (item.split("=") for item in args.slo_ms.split(","))}
    print(f"{'policy':>7} {'lane':>6} {'mean s':>8} {'p99 s':>8} {'tokens/s':>9} {'goodput req/s':>14}")
    runs: dict[str, list[tuple[dict[str, list[float]], float, float]]] = {"fcfs": [], "effort": []}
    for repeat in range(args.repeats):
        # ABBA order: a host load that rises (or falls) during the runs favours neither policy.
        for policy in list(runs)[:: 1 if repeat % 2 == 0 else -1]:
            runs[policy].append(asyncio.run(replay(model_dir, policy, requests, budgets, args.answer_tokens,
                                                   args.max_num_seqs, args.lane_bounds)))
    summaries = {policy: summarise(policy_runs, slos) for policy, policy_runs in runs.items()}
    for policy, summary in summaries.items():
        for effort, (mean, tail) in summary.lanes.items():
            print(f"{policy:>7} {effort:>6} {mean:8.3f} {tail:8.3f} {summary.throughput:9.0f} {summary.goodput:14.2f}")
    fcfs, effort = summaries["fcfs"], summaries["effort"]
    if "low" in fcfs.lanes:
        print(f"low-effort p99 time to answer, fcfs / effort: {fcfs.lanes['low'][1] / effort.lanes['low'][1]:.1f}x; "
              f"throughput, effort / fcfs: {effort.throughput / fcfs.throughput:.2f}")

if __name__ == "__main__":
    main()
