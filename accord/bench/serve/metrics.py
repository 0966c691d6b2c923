"""The figures of one rung under vLLM's `bench serve` result keys: counts, throughput
and goodput, and for each selected metric (ttft, tpot, itl, e2el) its mean, median,
standard deviation and percentiles in milliseconds (`mean_ttft_ms`, `p99_tpot_ms`, ...).
Percentiles interpolate linearly between samples (numpy's default, as vLLM's)."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from .request_types import RequestOutcome

#: The metrics `--percentile-metrics` may select, and those `--goodput` may bound.
PERCENTILE_METRICS = ("ttft", "tpot", "itl", "e2el")
SLO_METRICS = ("ttft", "tpot", "e2el")


def parse_goodput(pairs: Sequence[str] | None) -> dict[str, float]:
    """`--goodput ttft:2000 tpot:100` as {"ttft": 2000.0, "tpot": 100.0} (milliseconds)."""
    slos: dict[str, float] = {}
    for pair in pairs or ():
        name, _, value = pair.partition(":")
        try:
            slos[name] = float(value)
        except ValueError:
            raise ValueError(f"--goodput takes KEY:MILLISECONDS pairs such as ttft:2000, got {pair!r}") from None
        if name not in SLO_METRICS:
            raise ValueError(f"--goodput: {name!r} is no SLO metric; choose from {', '.join(SLO_METRICS)}")
        if slos[name] < 0:
            raise ValueError(f"--goodput: {pair!r} is negative")
    return slos


def parse_list(text: str, allowed: Sequence[str] | None = None) -> list[str]:
    """A comma-separated flag value as its items, each checked against `allowed`."""
    items = [item.strip() for item in text.split(",") if item.strip()]
    for item in items:
        if allowed is not None and item not in allowed:
            raise ValueError(f"{item!r} is not one of {', '.join(allowed)}")
    return items


def percentile_key(percentile: float) -> str:
    """How a percentile is written in a key: 99 -> "p99", 99.9 -> "p99.9" (vLLM's)."""
    return f"p{int(percentile)}" if percentile == int(percentile) else f"p{percentile}"


@dataclass(frozen=True)
class RequestFigures:
    """One successful request as the metrics see it: its token counts (the server's
    usage where it gave one) and its times in seconds."""

    input_tokens: int
    output_tokens: int
    ttft: float
    latency: float
    itl: tuple[float, ...]
    start_time: float

    @property
    def tpot(self) -> float:
        """Time per output token after the first; 0 for a one-token answer (vLLM's rule)."""
        return (self.latency - self.ttft) / (self.output_tokens - 1) if self.output_tokens > 1 else 0.0


def request_figures(outcome: RequestOutcome, count_tokens: Callable[[str], int] | None) -> RequestFigures:
    """A successful outcome's figures: token counts from the server's usage when it gave
    them, else the prompt as sent and the text counted by `count_tokens` (else one token
    per chunk that carried tokens)."""
    output = outcome.usage_completion_tokens
    if output is None:
        output = count_tokens(outcome.generated_text) if count_tokens else 1 + len(outcome.itl)
    prompt = outcome.usage_prompt_tokens if outcome.usage_prompt_tokens is not None else outcome.prompt_len
    return RequestFigures(prompt, output, outcome.ttft, outcome.latency, tuple(outcome.itl), outcome.start_time)


def is_good(request: RequestFigures, slos_ms: dict[str, float]) -> bool:
    """Whether every SLO holds for `request` (each bound inclusive)."""
    seconds = {"ttft": request.ttft, "tpot": request.tpot, "e2el": request.latency}
    return all(seconds[name] * 1000 <= bound for name, bound in slos_ms.items())


def _summary(name: str, values_s: Sequence[float], percentiles: Sequence[float]) -> dict[str, float]:
    values = np.asarray(values_s or [0.0]) * 1000  # vLLM reports 0 for a metric with no samples
    figures = {
        f"mean_{name}_ms": float(values.mean()),
        f"median_{name}_ms": float(np.median(values)),
        f"std_{name}_ms": float(values.std()),
    }
    figures |= {f"{percentile_key(p)}_{name}_ms": float(np.percentile(values, p)) for p in percentiles}
    return figures


def peak_output_rate(requests: Sequence[RequestFigures]) -> tuple[float, int]:
    """vLLM's `max_output_tokens_per_s` (the most token arrivals in one whole second of
    the run, counted from the first request's start) and `max_concurrent_requests`
    (the most requests in flight at once)."""
    if not requests:
        return 0.0, 0
    first = min(r.start_time for r in requests)
    buckets: dict[int, int] = {}
    for r in requests:
        arrival = r.start_time + r.ttft
        for gap in (0.0, *r.itl):
            arrival += gap
            buckets[int(arrival - first)] = buckets.get(int(arrival - first), 0) + 1
    # Ends sort before starts at the same instant: a request that ends as another starts
    # does not overlap it.
    events = sorted([(r.start_time, 1) for r in requests] + [(r.start_time + r.latency, -1) for r in requests])
    in_flight = peak = 0
    for _, step in events:
        in_flight += step
        peak = max(peak, in_flight)
    return float(max(buckets.values())), peak


def compute_metrics(
    outcomes: Sequence[RequestOutcome],
    duration_s: float,
    selected_metrics: Sequence[str],
    percentiles: Sequence[float],
    slos_ms: dict[str, float],
    count_tokens: Callable[[str], int] | None = None,
) -> dict[str, Any]:
    """The rung's figures under vLLM's keys, from every outcome (failed ones count as
    failed and add no tokens) over `duration_s`. `request_goodput` is None without SLOs,
    as in vLLM; `good_requests` and `goodput_slos_ms` are accord's additions."""
    done = [request_figures(o, count_tokens) for o in outcomes if o.success]
    good = sum(is_good(r, slos_ms) for r in done) if slos_ms else None
    total_input = sum(r.input_tokens for r in done)
    total_output = sum(r.output_tokens for r in done)
    peak_rate, peak_in_flight = peak_output_rate(done)
    figures: dict[str, Any] = {
        "duration": duration_s,
        "completed": len(done),
        "failed": len(outcomes) - len(done),
        "total_input_tokens": total_input,
        "total_output_tokens": total_output,
        "request_throughput": len(done) / duration_s,
        "request_goodput": good / duration_s if good is not None else None,
        "output_throughput": total_output / duration_s,
        "total_token_throughput": (total_input + total_output) / duration_s,
        "max_output_tokens_per_s": peak_rate,
        "max_concurrent_requests": peak_in_flight,
        "good_requests": good,
        "goodput_slos_ms": dict(slos_ms),
    }
    samples = {
        "ttft": [r.ttft for r in done],
        "tpot": [r.tpot for r in done if r.output_tokens > 1],
        "itl": [gap for r in done for gap in r.itl],
        "e2el": [r.latency for r in done],
    }
    for name in selected_metrics:
        figures |= _summary(name, samples[name], percentiles)
    return figures


def detailed_lists(outcomes: Sequence[RequestOutcome], count_tokens: Callable[[str], int] | None) -> dict[str, list]:
    """The per-request lists vLLM keeps under `--save-detailed` (failed requests as zeros)."""
    figures = [request_figures(o, count_tokens) if o.success else None for o in outcomes]
    return {
        "input_lens": [f.input_tokens if f else o.prompt_len for f, o in zip(figures, outcomes)],
        "output_lens": [f.output_tokens if f else 0 for f in figures],
        "ttfts": [o.ttft for o in outcomes],
        "itls": [o.itl for o in outcomes],
        "latencies": [o.latency for o in outcomes],
        "start_times": [o.start_time for o in outcomes],
        "generated_texts": [o.generated_text for o in outcomes],
        "errors": [o.error for o in outcomes],
    }

