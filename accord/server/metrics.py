"""Prometheus metrics under vLLM's names (`vllm:*`), labels and histogram buckets, so
dashboards built for vLLM (its published Grafana dashboard) work unchanged.

Latency and per-request token histograms are observed by the server from each finished
request's timings; everything the engine counts itself (queue lengths, KV cache usage,
token, prefix-cache and preemption counters) is read from an engine stats snapshot at
scrape time, so it is never stale and never counted twice. Every series carries vLLM's
`model_name` and `engine` labels; with data parallelism the engine-counted series come
once per replica (`engine="<replica>"`, as vLLM labels its engine cores), while the
request histograms, which the one API server observes for all replicas, carry
`model_name` alone.

Series with no vLLM counterpart keep accord's prefix, so no dashboard mistakes them for
vLLM's: `accord:request_failure` (requests an engine failure or a shutdown ended),
`accord:num_prompts_tokenizing`, `accord:lora_generation_tokens` (per adapter),
`accord:tenant_reasoning_tokens` (thinking tokens per tenant, the labels bounded), and the scheduler's decisions: `accord:preemptions` by
reason and `accord:request_queue_time_by_lane_seconds`. The vLLM-named series are not duplicated
under `accord:` as well: that would double every scrape's cardinality for no reader.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import AbstractContextManager

import prometheus_client
from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, HistogramMetricFamily, Metric
from prometheus_client.registry import Collector

from ..core.outputs import RequestOutput
from ..core.stats import ITERATION_TOKEN_BUCKETS, REQUEST_LATENCY_BUCKETS, EngineStats

#: vLLM's bucket families (vllm/v1/metrics/buckets.py) beside the request phases'
#: (core/stats.py): time to first token, and the gaps between tokens.
TIME_TO_FIRST_TOKEN_BUCKETS = (
    0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0, 20.0, 40.0, 80.0,
    160.0, 640.0, 2560.0,
)
INTER_TOKEN_LATENCY_BUCKETS = (
    0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0, 20.0, 40.0, 80.0,
)


def token_count_buckets(max_model_len: int) -> tuple[int, ...]:
    """vLLM's buckets for per-request token counts: 1, 2, 5, 10, 20, 50, ... up to the
    context length."""
    buckets, scale = [], 1
    while True:
        for mantissa in (1, 2, 5):
            if mantissa * scale > max_model_len:
                return tuple(buckets)
            buckets.append(mantissa * scale)
        scale *= 10


#: Distinct tenant labels kept; every later tenant is OTHER_TENANT. A tenant is the
#: client's word (a header), so its labels are bounded: no client grows /metrics at will.
MAX_TENANT_LABELS = 64
OTHER_TENANT = "other"


class TenantLabels:
    """The /metrics label of each tenant: its own for the first MAX_TENANT_LABELS
    seen, OTHER_TENANT after."""

    def __init__(self, limit: int = MAX_TENANT_LABELS) -> None:
        self._limit = limit
        self._seen: set[str] = set()

    def label(self, tenant: str) -> str:
        """The label `tenant`'s series carries."""
        if tenant in self._seen:
            return tenant
        if len(self._seen) < self._limit:
            self._seen.add(tenant)
            return tenant
        return OTHER_TENANT


class ServerMetrics:
    """The metrics of one server, in their own registry (so several apps can live in
    one process, as in tests)."""

    def __init__(
        self, model_name: str, replica_stats: Callable[[], Sequence[EngineStats]], max_model_len: int
    ) -> None:
        # `*_created` series only add noise to every counter and histogram (vLLM drops
        # them too); the switch is process-wide in prometheus_client.
        prometheus_client.disable_created_metrics()
        self.registry = CollectorRegistry()
        # One replica: the API server's requests are all engine 0's, as in vLLM.
        single = len(replica_stats()) == 1
        self._labels = (model_name, "0") if single else (model_name,)
        labels = ["model_name", "engine"] if single else ["model_name"]

        def histogram(name: str, documentation: str, buckets: Sequence[float]) -> Histogram:
            return Histogram(f"vllm:{name}", documentation, labels, buckets=buckets, registry=self.registry)

        def counter(name: str, documentation: str, extra: str) -> Counter:
            return Counter(name, documentation, [*labels, extra], registry=self.registry)

        token_buckets = token_count_buckets(max_model_len)
        self._ttft = histogram("time_to_first_token_seconds", "Time to first token.", TIME_TO_FIRST_TOKEN_BUCKETS)
        self._itl = histogram(
            "inter_token_latency_seconds", "Time between outputs, per token they brought.", INTER_TOKEN_LATENCY_BUCKETS
        )
        self._tpot = histogram(
            "request_time_per_output_token_seconds", "Mean time per output token of each finished request.",
            INTER_TOKEN_LATENCY_BUCKETS,
        )
        self._e2e = histogram("e2e_request_latency_seconds", "End-to-end request latency.", REQUEST_LATENCY_BUCKETS)
        self._queue = histogram(
            "request_queue_time_seconds", "Time requests spent waiting to be scheduled.", REQUEST_LATENCY_BUCKETS
        )
        self._prompt_tokens = histogram("request_prompt_tokens", "Prompt tokens per finished request.", token_buckets)
        self._generation_tokens = histogram(
            "request_generation_tokens", "Generated tokens per finished request.", token_buckets
        )
        self._request_success = counter(
            "vllm:request_success", "Requests that ended, by finish reason (abort included, as vLLM).",
            "finished_reason",
        )
        self._request_failure = counter("accord:request_failure", "Requests the engine or a shutdown failed.", "reason")
        self._request_rejected = Counter(
            "vllm:admission_rejections", "Requests refused before admission (429), by reason.", ["model_name", "reason"],
            registry=self.registry,
        )
        self._reasoning_tokens = Counter(
            "vllm:reasoning_tokens", "Generated tokens that were a reasoning model's thinking (--reasoning-parser).",
            labels, registry=self.registry,
        )
        self._tenant_reasoning_tokens = Counter(
            "accord:tenant_reasoning_tokens", "Thinking tokens per tenant (X-Tenant-Id or API key; the first "
            f"{MAX_TENANT_LABELS} tenants seen are labelled, later ones are \"{OTHER_TENANT}\").",
            ["model_name", "tenant"], registry=self.registry,
        )
        self._tenant_labels = TenantLabels()
        self._model_name = model_name
        self._tokenizing = Gauge(
            "accord:num_prompts_tokenizing", "Prompts (texts or rendered conversations) being tokenised now.", labels,
            registry=self.registry,
        )
        self.registry.register(_EngineStatsCollector(model_name, replica_stats))

    def reasoning_tokens(self, count: int, tenant: str | None = None) -> None:
        """Count a response's thinking tokens, and under `tenant` when one is known."""
        self._reasoning_tokens.labels(*self._labels).inc(count)
        if tenant is not None:
            self._tenant_reasoning_tokens.labels(self._model_name, self._tenant_labels.label(tenant)).inc(count)

    def request_finished(self, output: RequestOutput, finish_reason: str) -> None:
        """Record one finished engine request from its timings and token counts."""
        times = output.metrics
        for histogram, value in (
            (self._ttft, times.time_to_first_token),
            (self._tpot, times.time_per_output_token),
            (self._e2e, times.e2e_latency),
            (self._queue, times.queue_time),
            (self._prompt_tokens, len(output.prompt_token_ids)),
            (self._generation_tokens, sum(len(sample.token_ids) for sample in output.outputs)),
        ):
            if value is not None:
                histogram.labels(*self._labels).observe(value)
        self._request_success.labels(*self._labels, finish_reason).inc()

    def request_ended_early(self, reason: str) -> None:
        """Record a request that did not finish: "abort" (its client left) counts as a
        success with finished_reason="abort", as vLLM; anything else as a failure."""
        if reason == "abort":
            self._request_success.labels(*self._labels, "abort").inc()
        else:
            self._request_failure.labels(*self._labels, reason).inc()

    def request_rejected(self, reason: str) -> None:
        """Record a request refused by admission control."""
        self._request_rejected.labels(self._model_name, reason).inc()

    def tokenizing(self) -> AbstractContextManager[None]:
        """Counts one prompt in the tokenizing gauge for as long as the block runs."""
        return self._tokenizing.labels(*self._labels).track_inprogress()

    def output_interval(self, seconds_per_token: float) -> None:
        """Record one interval between a request's outputs, per token it brought."""
        self._itl.labels(*self._labels).observe(seconds_per_token)

    def render(self) -> bytes:
        """The Prometheus text exposition of every metric."""
        return generate_latest(self.registry)


#: The engine-counted series: (name, help, kind, value of a stats snapshot).
_ENGINE_SERIES: tuple[tuple[str, str, type, Callable[[EngineStats], float]], ...] = (
    ("num_requests_running", "Requests being computed.", GaugeMetricFamily, lambda s: s.num_running),
    ("num_requests_waiting", "Requests waiting to be scheduled.", GaugeMetricFamily, lambda s: s.num_waiting),
    (
        "kv_cache_usage_perc", "Fraction of KV cache blocks in use (1 = full).", GaugeMetricFamily,
        lambda s: s.kv_cache_usage,
    ),
    ("prompt_tokens", "Prompt tokens of admitted requests.", CounterMetricFamily, lambda s: s.prompt_tokens),
    ("generation_tokens", "Tokens generated.", CounterMetricFamily, lambda s: s.generation_tokens),
    (
        "prefix_cache_queries", "Prompt tokens looked up in the prefix cache.", CounterMetricFamily,
        lambda s: s.prefix_cache_queries,
    ),
    (
        "prefix_cache_hits", "Prompt tokens found in the prefix cache.", CounterMetricFamily,
        lambda s: s.prefix_cache_hits,
    ),
    ("num_preemptions", "Requests preempted (recomputed later).", CounterMetricFamily, lambda s: s.num_preemptions),
)


class _EngineStatsCollector(Collector):
    """Reports the engine's stats snapshots (one per data-parallel replica) as gauges
    and counters at scrape time, each replica's labelled `engine="<replica>"`."""

    def __init__(self, model_name: str, replica_stats: Callable[[], Sequence[EngineStats]]) -> None:
        self._model_name = model_name
        self._replica_stats = replica_stats

    def collect(self) -> Iterator[Metric]:
        replicas = self._replica_stats()
        label_names = ["model_name", "engine"]
        label_values = [[self._model_name, str(replica)] for replica in range(len(replicas))]
        for name, documentation, kind, value in _ENGINE_SERIES:
            family = kind(f"vllm:{name}", documentation, labels=label_names)
            for labels, stats in zip(label_values, replicas):
                family.add_metric(labels, value(stats))
            yield family
        iteration = HistogramMetricFamily(
            "vllm:iteration_tokens_total", "Tokens computed per engine step.", labels=label_names
        )
        for labels, stats in zip(label_values, replicas):
            iteration.add_metric(labels, _cumulative(ITERATION_TOKEN_BUCKETS, stats.iteration_tokens_counts),
                                 stats.iteration_tokens_sum)
        yield iteration
        yield from _spec_decode_families(label_names, label_values, replicas)
        yield from _scheduling_families(label_names, label_values, replicas)
        if any(stats.max_lora for stats in replicas):
            # vLLM's info gauge holds the wall-clock time of its update: here, the scrape.
            yield from _lora_families(label_names, label_values, replicas, time.time())


def _cumulative(bounds: Sequence[float], counts: Sequence[int]) -> list[tuple[str, float]]:
    """A histogram's buckets in Prometheus' form: (upper bound, observations up to it),
    from per-bucket counts with one past the last bound."""
    cumulative, buckets = 0, []
    for bound, count in zip([*bounds, float("inf")], counts):
        cumulative += count
        buckets.append(("+Inf" if bound == float("inf") else str(bound), cumulative))
    return buckets


def _scheduling_families(
    label_names: list[str], label_values: list[list[str]], replicas: Sequence[EngineStats]
) -> Iterator[Metric]:
    """The scheduler's decisions, which vLLM does not export (so under accord's prefix):
    preemptions by reason, and queue time per scheduling lane (the effort policy's)."""
    preemptions = CounterMetricFamily(
        "accord:preemptions", "Requests preempted, by reason (kv_cache_full: blocks were needed; effort_lane_share: "
        "the effort policy made room for a shorter lane).", labels=[*label_names, "reason"],
    )
    queue_time = HistogramMetricFamily(
        "accord:request_queue_time_by_lane_seconds", "Seconds from arrival to first being scheduled, per scheduling "
        "lane (--scheduling-policy effort's lanes by expected decode length; one lane, 0, otherwise).",
        labels=[*label_names, "lane"],
    )
    for labels, stats in zip(label_values, replicas):
        for reason, count in sorted(stats.preemptions_by_reason.items()):
            preemptions.add_metric([*labels, reason], count)
        for lane, histogram in sorted(stats.lane_queue_time.items()):
            queue_time.add_metric([*labels, str(lane)], _cumulative(REQUEST_LATENCY_BUCKETS, histogram.counts),
                                  histogram.total)
    yield preemptions
    yield queue_time


def _lora_families(
    label_names: list[str], label_values: list[list[str]], replicas: Sequence[EngineStats], now: float
) -> Iterator[Metric]:
    """vLLM's `lora_requests_info` (the adapters running and waiting, comma-separated, and
    the device slots, as labels of a gauge holding the time), and the tokens generated
    per adapter (accord's: vLLM counts none per adapter)."""
    info = GaugeMetricFamily(
        "vllm:lora_requests_info", "Running stats on LoRA requests: the adapters of the running and the waiting "
        "requests, and --max-loras.", labels=[*label_names, "max_lora", "waiting_lora_adapters", "running_lora_adapters"],
    )
    tokens = CounterMetricFamily(
        "accord:lora_generation_tokens", "Tokens generated under each LoRA adapter.", labels=[*label_names, "lora_name"]
    )
    for labels, stats in zip(label_values, replicas):
        adapters = [str(stats.max_lora), ",".join(stats.waiting_lora_adapters), ",".join(stats.running_lora_adapters)]
        info.add_metric([*labels, *adapters], now)
        for name, count in sorted(stats.lora_generation_tokens.items()):
            tokens.add_metric([*labels, name], count)
    yield info
    yield tokens


#: Speculative decoding's counters, under vLLM's names: (name, help, value of a snapshot).
_SPEC_DECODE_SERIES: tuple[tuple[str, str, Callable[[EngineStats], int]], ...] = (
    ("spec_decode_num_drafts", "Draft checks (one per request per step with drafts).", lambda s: s.spec_decode_num_drafts),
    ("spec_decode_num_draft_tokens", "Drafted tokens checked.", lambda s: s.spec_decode_num_draft_tokens),
    ("spec_decode_num_accepted_tokens", "Drafted tokens accepted.", lambda s: s.spec_decode_num_accepted_tokens),
)


def _spec_decode_families(
    label_names: list[str], label_values: list[list[str]], replicas: Sequence[EngineStats]
) -> Iterator[Metric]:
    """vLLM's spec-decode counters, the per-position one labelled by draft position."""
    for name, documentation, value in _SPEC_DECODE_SERIES:
        family = CounterMetricFamily(f"vllm:{name}", documentation, labels=label_names)
        for labels, stats in zip(label_values, replicas):
            family.add_metric(labels, value(stats))
        yield family
    per_pos = CounterMetricFamily(
        "vllm:spec_decode_num_accepted_tokens_per_pos", "Drafted tokens accepted, by draft position.",
        labels=[*label_names, "position"],
    )
    for labels, stats in zip(label_values, replicas):
        for position, count in enumerate(stats.spec_decode_num_accepted_tokens_per_pos):
            per_pos.add_metric([*labels, str(position)], count)
    yield per_pos
