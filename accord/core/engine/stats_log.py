"""The engine's periodic log line (vLLM's log_stats): every `interval` seconds of
stepping, generation throughput since the last line, requests running and waiting, KV
cache use, and with speculative decoding the acceptance rate and accepted tokens per
draft position since the last line."""

from __future__ import annotations

import logging
from dataclasses import dataclass

from ..stats import EngineStats

logger = logging.getLogger("accord.engine")

#: Seconds between log lines (vLLM's default).
LOG_INTERVAL = 10.0


@dataclass
class PeriodicStatsLog:
    """Logs one line per `interval` seconds from the engine's stats, as differences."""

    interval: float = LOG_INTERVAL
    _last_time: float | None = None
    _last: tuple[int, int, int, list[int]] = (0, 0, 0, [])

    def maybe_log(self, stats: EngineStats, now: float) -> str | None:
        """Log (and return) the line when `interval` has passed since the last one."""
        if self._last_time is None:
            self._last_time, self._last = now, self._counters(stats)
            return None
        elapsed = now - self._last_time
        if elapsed < self.interval:
            return None
        generated, drafted, accepted, per_pos = self._counters(stats)
        last_generated, last_drafted, last_accepted, last_per_pos = self._last
        line = (
            f"generation throughput: {(generated - last_generated) / elapsed:.1f} tokens/s, running: "
            f"{stats.num_running} reqs, waiting: {stats.num_waiting} reqs, KV cache usage: {stats.kv_cache_usage:.1%}"
        )
        if drafted > last_drafted:
            positions = [now_count - (last_per_pos[i] if i < len(last_per_pos) else 0)
                         for i, now_count in enumerate(per_pos)]
            line += (f"; spec decode: acceptance rate {(accepted - last_accepted) / (drafted - last_drafted):.1%}, "
                     f"accepted per position {positions}")
        logger.info(line)
        self._last_time, self._last = now, (generated, drafted, accepted, per_pos)
        return line

    @staticmethod
    def _counters(stats: EngineStats) -> tuple[int, int, int, list[int]]:
        return (stats.generation_tokens, stats.spec_decode_num_draft_tokens, stats.spec_decode_num_accepted_tokens,
                list(stats.spec_decode_num_accepted_tokens_per_pos))
