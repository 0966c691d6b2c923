"""Prometheus metrics under `accord:*` names that mirror vLLM's `vllm:*` ones.

Latency histograms are observed by the server from each finished request's timings;
everything the engine counts itself (queue lengths, KV cache usage, token, prefix-cache
and preemption counters) is read from an engine stats snapshot at scrape time, so it
is never stale and never counted twice.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator

import prometheus_client
from prometheus_client import CollectorRegistry, Counter, Histogram, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from ..core.stats import EngineStats, RequestTimes

_LATENCY_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 20.0, 40.0, 80.0)
_TOKEN_LATENCY_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.075, 0.1, 0.25, 0.5, 1.0, 2.5)


class ServerMetrics:
    """The metrics of one server, in their own registry (so several apps can live in
    one process, as in tests)."""

    def __init__(self, model_name: str, engine_stats: Callable[[], EngineStats]) -> None:
        # `*_created` series only add noise to every counter and histogram (vLLM drops
        # them too); the switch is process-wide in prometheus_client.
        prometheus_client.disable_created_metrics()
        self.registry = CollectorRegistry()
        self.model_name = model_name
        labels = ["model_name"]
        self._ttft = Histogram(
            "accord:time_to_first_token_seconds", "Time to first token.", labels,
            buckets=_LATENCY_BUCKETS, registry=self.registry,
        )
        self._tpot = Histogram(
            "accord:time_per_output_token_seconds", "Mean time per output token after the first, per request.",
            labels, buckets=_TOKEN_LATENCY_BUCKETS, registry=self.registry,
        )
        self._e2e = Histogram(
            "accord:e2e_request_latency_seconds", "End-to-end request latency.", labels,
            buckets=_LATENCY_BUCKETS, registry=self.registry,
        )
        self._request_success = Counter(
            "accord:request_success", "Requests that finished, by finish reason.",
            [*labels, "finished_reason"], registry=self.registry,
        )
        self.registry.register(_EngineStatsCollector(model_name, engine_stats))

    def request_finished(self, times: RequestTimes, finish_reason: str) -> None:
        """Record one finished engine request (one sample) from its timings."""
        for histogram, value in (
            (self._ttft, times.time_to_first_token),
            (self._tpot, times.time_per_output_token),
            (self._e2e, times.e2e_latency),
        ):
            if value is not None:
                histogram.labels(self.model_name).observe(value)
        self._request_success.labels(self.model_name, finish_reason).inc()

    def render(self) -> bytes:
        """The Prometheus text exposition of every metric."""
        return generate_latest(self.registry)


class _EngineStatsCollector(Collector):
    """Reports an engine stats snapshot as gauges and counters at scrape time."""

    def __init__(self, model_name: str, engine_stats: Callable[[], EngineStats]) -> None:
        self._model_name = model_name
        self._engine_stats = engine_stats

    def collect(self) -> Iterator[Metric]:
        stats = self._engine_stats()
        gauges = (
            ("num_requests_running", "Requests being computed.", stats.num_running),
            ("num_requests_waiting", "Requests waiting to be scheduled.", stats.num_waiting),
            ("kv_cache_usage_perc", "Fraction of KV cache blocks in use (1 = full).", stats.kv_cache_usage),
        )
        counters = (
            ("prompt_tokens", "Prompt tokens of admitted requests.", stats.prompt_tokens),
            ("generation_tokens", "Tokens generated.", stats.generation_tokens),
            ("prefix_cache_queries", "Prompt tokens looked up in the prefix cache.", stats.prefix_cache_queries),
            ("prefix_cache_hits", "Prompt tokens found in the prefix cache.", stats.prefix_cache_hits),
            ("num_preemptions", "Requests preempted (recomputed later).", stats.num_preemptions),
        )
        for name, documentation, value in gauges:
            family = GaugeMetricFamily(f"accord:{name}", documentation, labels=["model_name"])
            family.add_metric([self._model_name], value)
            yield family
        for name, documentation, value in counters:
            family = CounterMetricFamily(f"accord:{name}", documentation, labels=["model_name"])
            family.add_metric([self._model_name], value)
            yield family
