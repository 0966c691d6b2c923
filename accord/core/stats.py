"""Engine statistics the server exports: per-request latencies and per-step gauges and
counters (vLLM's metric set)."""

from __future__ import annotations

import bisect
import itertools
from collections.abc import Sequence
from dataclasses import dataclass, field, fields

#: Upper bounds of the tokens-per-step histogram (vLLM's `iteration_tokens_total`).
ITERATION_TOKEN_BUCKETS = (1, 8, 16, 32, 64, 128, 256, 512, 1024, 2048, 4096, 8192, 16384)
#: vLLM's buckets for request phases in seconds (vllm/v1/metrics/buckets.py).
REQUEST_LATENCY_BUCKETS = (
    0.3, 0.5, 0.8, 1.0, 1.5, 2.0, 2.5, 5.0, 10.0, 15.0, 20.0, 30.0, 40.0, 50.0, 60.0, 120.0, 240.0, 480.0, 960.0,
    1920.0, 7680.0,
)
#: Why the scheduler preempted a request: its blocks were needed (the KV cache is full),
#: or the effort policy made room for a shorter lane's waiting requests.
PREEMPTED_FOR_KV_CACHE = "kv_cache_full"
PREEMPTED_FOR_LANE_SHARE = "effort_lane_share"


@dataclass
class LatencyHistogram:
    """Observations per REQUEST_LATENCY_BUCKETS bucket (and one past the last), and their sum."""

    counts: list[int] = field(default_factory=lambda: [0] * (len(REQUEST_LATENCY_BUCKETS) + 1))
    total: float = 0.0

    def observe(self, seconds: float) -> None:
        """Count one observation."""
        self.counts[bisect.bisect_left(REQUEST_LATENCY_BUCKETS, seconds)] += 1
        self.total += seconds

    def add(self, other: LatencyHistogram) -> None:
        """Count `other`'s observations too."""
        self.counts = [mine + theirs for mine, theirs in zip(self.counts, other.counts)]
        self.total += other.total


@dataclass
class RequestTimes:
    """Wall-clock marks of one request (time.monotonic seconds) and the latencies
    derived from them; a mark is None until reached."""

    arrival_time: float = 0.0
    first_scheduled_time: float | None = None
    first_token_time: float | None = None
    finished_time: float | None = None
    num_generation_tokens: int = 0
    #: Speculative decoding: tokens drafted for the request's samples, and accepted.
    num_draft_tokens: int = 0
    num_accepted_tokens: int = 0

    @property
    def acceptance_rate(self) -> float | None:
        """Accepted over drafted tokens (None when nothing was drafted)."""
        return self.num_accepted_tokens / self.num_draft_tokens if self.num_draft_tokens else None

    @property
    def queue_time(self) -> float | None:
        """Seconds from arrival to first being scheduled."""
        return None if self.first_scheduled_time is None else self.first_scheduled_time - self.arrival_time

    @property
    def time_to_first_token(self) -> float | None:
        """Seconds from arrival to the first generated token."""
        return None if self.first_token_time is None else self.first_token_time - self.arrival_time

    @property
    def e2e_latency(self) -> float | None:
        """Seconds from arrival to the end of the request."""
        return None if self.finished_time is None else self.finished_time - self.arrival_time

    @property
    def time_per_output_token(self) -> float | None:
        """Mean seconds between generated tokens after the first."""
        if self.finished_time is None or self.first_token_time is None or self.num_generation_tokens < 2:
            return None
        return (self.finished_time - self.first_token_time) / (self.num_generation_tokens - 1)


@dataclass
class EngineStats:
    """Gauges (running, waiting, KV blocks) as of the last step, and counters since start."""

    num_running: int = 0
    num_waiting: int = 0
    kv_blocks_used: int = 0
    kv_blocks_total: int = 0
    prefix_cache_queries: int = 0
    prefix_cache_hits: int = 0
    num_preemptions: int = 0
    prompt_tokens: int = 0
    generation_tokens: int = 0
    #: Prompt tokens run through the model (prefix-cache hits excluded, recomputation
    #: after preemption included).
    computed_prompt_tokens: int = 0
    #: KV connector loads that failed (their requests computed those tokens instead).
    kv_loads_failed: int = 0
    num_steps: int = 0
    #: Steps per ITERATION_TOKEN_BUCKETS bucket (and one past the last), and their token sum.
    iteration_tokens_counts: list[int] = field(default_factory=lambda: [0] * (len(ITERATION_TOKEN_BUCKETS) + 1))
    iteration_tokens_sum: int = 0
    #: Speculative decoding (vLLM's spec_decode counters): requests' draft checks, the
    #: drafted and accepted tokens, and acceptances by draft position.
    spec_decode_num_drafts: int = 0
    spec_decode_num_draft_tokens: int = 0
    spec_decode_num_accepted_tokens: int = 0
    spec_decode_num_accepted_tokens_per_pos: list[int] = field(default_factory=list)
    #: Preemptions by why they happened (PREEMPTED_FOR_*).
    preemptions_by_reason: dict[str, int] = field(default_factory=dict)
    #: Seconds from arrival to first being scheduled, per scheduling lane (the effort
    #: policy's lanes; other policies have one, lane 0).
    lane_queue_time: dict[int, LatencyHistogram] = field(default_factory=dict)
    #: LoRA (vLLM's lora_requests_info): the adapters of the running and the waiting
    #: requests as of the last step (names, sorted), and the device slots (--max-loras;
    #: 0 without LoRA).
    running_lora_adapters: tuple[str, ...] = ()
    waiting_lora_adapters: tuple[str, ...] = ()
    max_lora: int = 0
    #: Tokens generated per LoRA adapter (by name) since start.
    lora_generation_tokens: dict[str, int] = field(default_factory=dict)

    def observe_drafts(self, num_drafts: int, num_accepted: int) -> None:
        """Count one request's check of `num_drafts` drafts, `num_accepted` of them kept
        (always a prefix: acceptance stops at the first rejection)."""
        self.spec_decode_num_drafts += 1
        self.spec_decode_num_draft_tokens += num_drafts
        self.spec_decode_num_accepted_tokens += num_accepted
        per_pos = self.spec_decode_num_accepted_tokens_per_pos
        per_pos.extend([0] * (num_drafts - len(per_pos)))
        for position in range(num_accepted):
            per_pos[position] += 1

    @property
    def spec_decode_acceptance_rate(self) -> float | None:
        """Accepted over drafted tokens since start (None before any draft)."""
        drafted = self.spec_decode_num_draft_tokens
        return self.spec_decode_num_accepted_tokens / drafted if drafted else None

    def observe_iteration(self, num_tokens: int) -> None:
        """Count one step that computed `num_tokens` tokens."""
        self.iteration_tokens_counts[bisect.bisect_left(ITERATION_TOKEN_BUCKETS, num_tokens)] += 1
        self.iteration_tokens_sum += num_tokens

    @classmethod
    def combined(cls, parts: Sequence[EngineStats]) -> EngineStats:
        """Several data-parallel replicas' stats as one engine's: every gauge, counter
        and histogram bucket summed (so kv_cache_usage is over all their blocks)."""
        total = cls()
        for item in fields(cls):
            if item.name in ("preemptions_by_reason", "lora_generation_tokens"):
                counts = getattr(total, item.name)
                for part in parts:
                    for key, count in getattr(part, item.name).items():
                        counts[key] = counts.get(key, 0) + count
            elif item.name in ("running_lora_adapters", "waiting_lora_adapters"):
                setattr(total, item.name, tuple(sorted({name for part in parts for name in getattr(part, item.name)})))
            elif item.name == "max_lora":  # each replica has its own slots: as many adapters, not more
                total.max_lora = max((part.max_lora for part in parts), default=0)
            elif item.name == "lane_queue_time":
                for part in parts:
                    for lane, histogram in part.lane_queue_time.items():
                        total.lane_queue_time.setdefault(lane, LatencyHistogram()).add(histogram)
            elif item.name in ("iteration_tokens_counts", "spec_decode_num_accepted_tokens_per_pos"):
                columns = itertools.zip_longest(*(getattr(part, item.name) for part in parts), fillvalue=0)
                setattr(total, item.name, [sum(column) for column in columns])
            else:
                setattr(total, item.name, sum(getattr(part, item.name) for part in parts))
        return total

    @property
    def kv_cache_usage(self) -> float:
        """Fraction of KV blocks in use."""
        return self.kv_blocks_used / self.kv_blocks_total if self.kv_blocks_total else 0.0
