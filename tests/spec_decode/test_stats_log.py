"""The periodic log line: one per interval, with throughput since the last line and,
when drafts were checked, the acceptance rate and accepted tokens by position."""

from __future__ import annotations

from accord.core.engine.stats_log import PeriodicStatsLog
from accord.core.stats import EngineStats


def test_one_line_per_interval_with_the_acceptance_since_the_last_line() -> None:
    log, stats = PeriodicStatsLog(interval=10.0), EngineStats()
    assert log.maybe_log(stats, 0.0) is None  # the first call only starts the clock
    stats.generation_tokens = 50
    stats.observe_drafts(4, 3)
    assert log.maybe_log(stats, 5.0) is None
    line = log.maybe_log(stats, 10.0)
    assert "5.0 tokens/s" in line and "acceptance rate 75.0%" in line and "[1, 1, 1, 0]" in line
    stats.observe_drafts(4, 1)
    stats.generation_tokens = 70
    line = log.maybe_log(stats, 20.0)
    assert "2.0 tokens/s" in line and "acceptance rate 25.0%" in line and "[1, 0, 0, 0]" in line


def test_no_spec_decode_part_without_drafts() -> None:
    log, stats = PeriodicStatsLog(interval=1.0), EngineStats()
    log.maybe_log(stats, 0.0)
    assert "spec decode" not in log.maybe_log(stats, 2.0)
