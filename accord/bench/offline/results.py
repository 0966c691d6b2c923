"""What one engine measured: each run of each workload, summarised by the median run."""

from __future__ import annotations

import statistics
from dataclasses import dataclass


@dataclass(frozen=True)
class Result:
    """One engine's run over (part of) the trace."""

    engine: str
    requests: int
    output_tokens: int
    seconds: float

    @property
    def output_tokens_per_s(self) -> float:
        return self.output_tokens / self.seconds


@dataclass(frozen=True)
class Runs:
    """One engine's runs of one workload (the batch-1 workload is repeated, the others
    run once), summarised by the median run: one slow minute of a shared host does not
    move it."""

    runs: tuple[Result, ...]

    @property
    def output_tokens_per_s(self) -> float:
        """The median of the runs' output tokens/s."""
        return statistics.median(run.output_tokens_per_s for run in self.runs)

    @property
    def rate_range(self) -> tuple[float, float]:
        """The slowest and the fastest run's output tokens/s."""
        rates = [run.output_tokens_per_s for run in self.runs]
        return min(rates), max(rates)

    def figures(self) -> dict[str, object]:
        """The JSON figures: the keys of one `Result` (output_tokens per run, seconds and
        output_tokens_per_s the medians), the min-max rate and every run's own figures."""
        first = self.runs[0]
        low, high = self.rate_range
        return {
            "engine": first.engine,
            "requests": first.requests,
            "output_tokens": first.output_tokens,
            "seconds": statistics.median(run.seconds for run in self.runs),
            "output_tokens_per_s": self.output_tokens_per_s,
            "output_tokens_per_s_min": low,
            "output_tokens_per_s_max": high,
            "runs": [
                {"output_tokens": r.output_tokens, "seconds": r.seconds, "output_tokens_per_s": r.output_tokens_per_s}
                for r in self.runs
            ],
        }


@dataclass(frozen=True)
class EngineRun:
    """One engine over every workload: start-up seconds (None: the engine's tools do not
    report it) and its runs of each workload."""

    startup: float | None
    results: dict[str, Runs]
    #: Decode tokens/s of each batch-1 run (first token to last), when measured.
    batch1_decode: tuple[float, ...] = ()
    #: The device's copy bandwidth (bytes/s) measured before the first batch-1 run and
    #: after each, when measured: the rooflines the runs are held to.
    batch1_bandwidth: tuple[float, ...] = ()


def run_label(index: int, count: int) -> str:
    """How a progress line names run `index` of `count` (nothing for a single run)."""
    return f" (run {index + 1}/{count})" if count > 1 else ""
