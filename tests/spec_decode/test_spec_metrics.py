"""The spec-decode counters: each draft check counted (drafts, drafted and accepted
tokens, acceptances by position), summed over data-parallel replicas, and exported in
/metrics under vLLM's names."""

from __future__ import annotations

from prometheus_client.parser import text_string_to_metric_families

from accord.core.stats import EngineStats
from accord.server.metrics import ServerMetrics


def checked(*checks: tuple[int, int]) -> EngineStats:
    stats = EngineStats()
    for drafted, accepted in checks:
        stats.observe_drafts(drafted, accepted)
    return stats


def test_a_check_counts_its_drafts_and_the_positions_it_accepted() -> None:
    stats = checked((3, 2), (4, 0), (2, 2))
    assert (stats.spec_decode_num_drafts, stats.spec_decode_num_draft_tokens, stats.spec_decode_num_accepted_tokens) == (
        3, 9, 4)
    assert stats.spec_decode_num_accepted_tokens_per_pos == [2, 2, 0, 0]
    assert stats.spec_decode_acceptance_rate == 4 / 9


def test_replicas_add_up_position_by_position() -> None:
    total = EngineStats.combined([checked((2, 1)), checked((4, 3))])
    assert total.spec_decode_num_accepted_tokens_per_pos == [2, 1, 1, 0]
    assert total.spec_decode_num_draft_tokens == 6


def test_metrics_export_vllms_spec_decode_counters() -> None:
    metrics = ServerMetrics("m", lambda: [checked((3, 2), (3, 1))], 256)
    samples = {
        (sample.name, sample.labels.get("position")): sample.value
        for family in text_string_to_metric_families(metrics.render().decode())
        for sample in family.samples
        if sample.name.startswith("vllm:spec_decode")
    }
    assert samples == {
        ("vllm:spec_decode_num_drafts_total", None): 2,
        ("vllm:spec_decode_num_draft_tokens_total", None): 6,
        ("vllm:spec_decode_num_accepted_tokens_total", None): 3,
        ("vllm:spec_decode_num_accepted_tokens_per_pos_total", "0"): 2,
        ("vllm:spec_decode_num_accepted_tokens_per_pos_total", "1"): 1,
        ("vllm:spec_decode_num_accepted_tokens_per_pos_total", "2"): 0,
    }
