"""The engine-counted metrics come once per data-parallel replica, labelled
`engine="<replica>"` (vLLM's label); a single replica is engine "0", as in vLLM."""

from __future__ import annotations

from prometheus_client.parser import text_string_to_metric_families

from accord.core.stats import EngineStats
from accord.server.metrics import ServerMetrics


def samples(metrics: ServerMetrics) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    text = metrics.render().decode()
    return {
        (sample.name, tuple(sorted(sample.labels.items()))): sample.value
        for family in text_string_to_metric_families(text)
        for sample in family.samples
    }


def test_two_replicas_report_their_own_gauges_and_counters() -> None:
    first = EngineStats(num_running=1, num_waiting=4, generation_tokens=10, kv_blocks_used=1, kv_blocks_total=4)
    second = EngineStats(num_running=2, num_waiting=0, generation_tokens=3, kv_blocks_used=3, kv_blocks_total=4)
    second.observe_iteration(7)
    found = samples(ServerMetrics("m", lambda: [first, second], 256))

    def value(name: str, replica: str, **extra: str) -> float:
        return found[(name, tuple(sorted({"model_name": "m", "engine": replica, **extra}.items())))]

    assert (value("vllm:num_requests_running", "0"), value("vllm:num_requests_running", "1")) == (1, 2)
    assert (value("vllm:num_requests_waiting", "0"), value("vllm:num_requests_waiting", "1")) == (4, 0)
    assert (value("vllm:kv_cache_usage_perc", "0"), value("vllm:kv_cache_usage_perc", "1")) == (0.25, 0.75)
    assert (value("vllm:generation_tokens_total", "0"), value("vllm:generation_tokens_total", "1")) == (10, 3)
    assert value("vllm:iteration_tokens_total_count", "0") == 0
    assert value("vllm:iteration_tokens_total_bucket", "1", le="8") == 1


def test_one_replica_is_engine_0_on_every_series() -> None:
    metrics = ServerMetrics("m", lambda: [EngineStats(num_running=5)], 256)
    metrics.request_ended_early("abort")
    found = samples(metrics)
    assert found[("vllm:num_requests_running", (("engine", "0"), ("model_name", "m")))] == 5
    assert found[("vllm:request_success_total", (("engine", "0"), ("finished_reason", "abort"), ("model_name", "m")))] == 1


def test_with_replicas_the_servers_request_series_carry_the_model_alone() -> None:
    metrics = ServerMetrics("m", lambda: [EngineStats(), EngineStats()], 256)
    metrics.request_ended_early("abort")
    assert samples(metrics)[("vllm:request_success_total", (("finished_reason", "abort"), ("model_name", "m")))] == 1
