"""/metrics shows the scheduler's decisions (accord/server/metrics.py, read from engine
stats snapshots): preemptions by reason, and queue time per scheduling lane, per
replica; combined stats (data parallelism) add them up. Series names and labels are
checked in the exposition text the endpoint serves."""

from __future__ import annotations

from prometheus_client.parser import text_string_to_metric_families

from accord.core.stats import PREEMPTED_FOR_KV_CACHE, PREEMPTED_FOR_LANE_SHARE, EngineStats, LatencyHistogram
from accord.server.metrics import ServerMetrics


def lane_stats(preemptions: dict[str, int], queue_times: dict[int, list[float]]) -> EngineStats:
    stats = EngineStats(preemptions_by_reason=dict(preemptions))
    for lane, seconds in queue_times.items():
        histogram = stats.lane_queue_time.setdefault(lane, LatencyHistogram())
        for value in seconds:
            histogram.observe(value)
    return stats


def scrape(stats: list[EngineStats]) -> dict[tuple[str, frozenset], float]:
    text = ServerMetrics("m", lambda: stats, 256).render().decode()
    return {
        (sample.name, frozenset(sample.labels.items())): sample.value
        for family in text_string_to_metric_families(text) for sample in family.samples
    }


def labelled(engine: str, **labels: str) -> frozenset:
    return frozenset({"model_name": "m", "engine": engine, **labels}.items())


def test_preemptions_are_counted_by_reason() -> None:
    found = scrape([lane_stats({PREEMPTED_FOR_KV_CACHE: 3, PREEMPTED_FOR_LANE_SHARE: 2}, {})])
    assert found[("accord:preemptions_total", labelled("0", reason="kv_cache_full"))] == 3
    assert found[("accord:preemptions_total", labelled("0", reason="effort_lane_share"))] == 2


def test_queue_time_is_a_histogram_per_lane_and_replica() -> None:
    found = scrape([lane_stats({}, {0: [0.1, 0.4], 2: [6.0]}), lane_stats({}, {0: [1.2]})])
    name = "accord:request_queue_time_by_lane_seconds"
    assert found[(f"{name}_count", labelled("0", lane="0"))] == 2
    assert found[(f"{name}_sum", labelled("0", lane="0"))] == 0.5
    assert found[(f"{name}_bucket", labelled("0", lane="0", le="0.3"))] == 1
    assert found[(f"{name}_bucket", labelled("0", lane="0", le="0.5"))] == 2
    assert found[(f"{name}_bucket", labelled("0", lane="2", le="5.0"))] == 0
    assert found[(f"{name}_bucket", labelled("0", lane="2", le="10.0"))] == 1
    assert found[(f"{name}_count", labelled("1", lane="0"))] == 1
    assert (f"{name}_count", labelled("1", lane="2")) not in found


def test_combined_replica_stats_add_preemptions_and_lane_histograms() -> None:
    total = EngineStats.combined([
        lane_stats({PREEMPTED_FOR_KV_CACHE: 1}, {0: [0.1], 1: [2.0]}),
        lane_stats({PREEMPTED_FOR_KV_CACHE: 2, PREEMPTED_FOR_LANE_SHARE: 1}, {0: [0.2]}),
    ])
    assert total.preemptions_by_reason == {PREEMPTED_FOR_KV_CACHE: 3, PREEMPTED_FOR_LANE_SHARE: 1}
    assert sum(total.lane_queue_time[0].counts) == 2 and abs(total.lane_queue_time[0].total - 0.3) < 1e-12
    assert sum(total.lane_queue_time[1].counts) == 1
