"""The order of waiting requests, and which of them may be admitted: FCFS, priority,
and effort (a reasoning request's expected decode length, its thinking budget plus its
max_tokens, is known, so lanes keep short requests from queueing behind long thinking
streams, and each lane is served shortest-remaining first).

The scheduler asks a policy two things: the key that orders its queues (smaller =
served first, preempted last) and, each step, whether a waiting request may be admitted.
"""

from __future__ import annotations

import bisect
import itertools
import math
from abc import ABC, abstractmethod
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from ..config import SchedulingPolicy
from .request import Request

#: A step's admission check: whether a waiting request may start now (each True answer
#: counts it as running for the answers after it).
Admission = Callable[[Request], bool]

#: Effort lanes by expected decode length (tokens): up to 512, up to 2048, beyond.
EFFORT_LANE_BOUNDS = (512, 2048)


class QueuePolicy(ABC):
    """How the scheduler orders and admits waiting requests."""

    @abstractmethod
    def order_key(self, request: Request) -> tuple[float, ...]:
        """The request's place in the queues: smaller is served first and preempted last."""

    def lane(self, request: Request) -> int:
        """The request's scheduling lane, for its queue-time metric (one lane, 0, unless
        a policy keeps several)."""
        return 0

    def preemption_class(self, request: Request) -> tuple[float, ...]:
        """What ranks above a request's rebuild cost when blocks run out: a request of a
        higher class is preempted before any of a lower one, whatever it costs (none,
        unless a policy says otherwise)."""
        return ()

    def admission(self, running: Sequence[Request], waiting: Sequence[Request]) -> Admission:
        """This step's admission check (every request, unless a policy says otherwise)."""
        return lambda request: True

    def preemptions(self, running: Sequence[Request], waiting: Sequence[Request]) -> list[Request]:
        """Running requests to preempt before this step, to make room for waiting ones
        the policy puts first (none, unless a policy says otherwise)."""
        return []


class FcfsPolicy(QueuePolicy):
    """First come, first served."""

    def order_key(self, request: Request) -> tuple[float, ...]:
        return request.arrival_time, request.arrival_order, request.index


class PriorityPolicy(QueuePolicy):
    """Lower `priority` first, then first come."""

    def order_key(self, request: Request) -> tuple[float, ...]:
        return request.priority, request.arrival_time, request.arrival_order, request.index

    def preemption_class(self, request: Request) -> tuple[float, ...]:
        return (request.priority,)


@dataclass(frozen=True)
class EffortPolicy(QueuePolicy):
    """Shortest remaining expected decode first (SRPT: with lengths known, it minimises
    mean latency), with lanes by expected decode length: while a request of a shorter
    lane waits, the requests of a lane and the longer ones together hold at most that
    lane's share of the sequences, 1/2^lane (past it they are not admitted, and when
    every slot is taken the longest-remaining of them are preempted), so short requests
    always find room; otherwise any lane may use every slot. A request without
    max_tokens expects the context's room."""

    max_num_seqs: int
    max_model_len: int | None
    #: Expected decode lengths dividing the lanes, ascending (lane 0: up to the first).
    lane_bounds: tuple[int, ...] = EFFORT_LANE_BOUNDS

    def __post_init__(self) -> None:
        if list(self.lane_bounds) != sorted(set(self.lane_bounds)) or any(b < 1 for b in self.lane_bounds):
            raise ValueError(f"effort lane bounds must be ascending positive token counts, got {self.lane_bounds}")

    def expected_decode_length(self, request: Request) -> int:
        """Output tokens the request expects in all: its thinking budget (and the end
        marker) plus max_tokens, or the context's room when it sets no max_tokens."""
        limit = request.max_output_tokens
        room = None if self.max_model_len is None else self.max_model_len - request.num_prompt_tokens
        if limit is None or (room is not None and room < limit):
            limit = room
        return limit if limit is not None else math.inf  # type: ignore[return-value]

    def lane(self, request: Request) -> int:
        """The request's lane (0: the shortest), by its expected decode length."""
        return bisect.bisect_left(self.lane_bounds, self.expected_decode_length(request))

    def remaining(self, request: Request) -> float:
        """Output tokens the request still expects."""
        return self.expected_decode_length(request) - request.num_output_tokens

    def order_key(self, request: Request) -> tuple[float, ...]:
        return self.remaining(request), request.arrival_time, request.arrival_order, request.index

    def shortest_lane(self, waiting: Sequence[Request]) -> int:
        """The shortest lane among the waiting requests. They are in `order_key` order, and
        a request's lane is at least the lane its remaining length would fall in, so the
        scan stops at the first request whose remaining length cannot beat the best lane
        so far: one or two requests, rather than the whole queue, each step."""
        best = len(self.lane_bounds)
        for request in waiting:
            if best == 0 or bisect.bisect_left(self.lane_bounds, self.remaining(request)) >= best:
                break
            best = min(best, self.lane(request))
        return best

    def preemption_class(self, request: Request) -> tuple[float, ...]:
        return (self.lane(request),)  # the longest lane gives way first

    def _lane_counts(self, running: Sequence[Request]) -> list[int]:
        counts = [0] * (len(self.lane_bounds) + 1)
        for request in running:
            counts[self.lane(request)] += 1
        return counts

    def _caps(self) -> list[int]:
        return [max(1, math.floor(self.max_num_seqs / 2**lane)) for lane in range(len(self.lane_bounds) + 1)]

    def preemptions(self, running: Sequence[Request], waiting: Sequence[Request]) -> list[Request]:
        if not waiting or len(running) < self.max_num_seqs:
            return []  # a free slot takes the next waiting request without preempting
        shortest_waiting = self.shortest_lane(waiting)
        counts, caps, victims = self._lane_counts(running), self._caps(), []
        if sum(counts[shortest_waiting + 1:]) == 0:
            return []  # nothing running of a longer lane
        # No more victims than the shortest lane's waiting requests, and never more than run.
        wanted = sum(1 for _ in itertools.islice(
            (request for request in waiting if self.lane(request) == shortest_waiting), len(running)))
        for request in sorted(running, key=self.order_key, reverse=True):
            lane = self.lane(request)
            if len(victims) == wanted:
                break
            if lane > shortest_waiting and sum(counts[lane:]) > caps[lane]:
                counts[lane] -= 1
                victims.append(request)
        return victims

    def admission(self, running: Sequence[Request], waiting: Sequence[Request]) -> Admission:
        if not waiting:
            return lambda request: True
        counts, caps = self._lane_counts(running), self._caps()
        shortest_waiting = self.shortest_lane(waiting)

        def admits(request: Request) -> bool:
            lane = self.lane(request)
            if lane > shortest_waiting and sum(counts[lane:]) >= caps[lane]:
                return False
            counts[lane] += 1
            return True

        return admits


def make_policy(
    name: SchedulingPolicy | QueuePolicy, max_num_seqs: int, max_model_len: int | None, effort_lane_bounds: str = ""
) -> QueuePolicy:
    """The policy `--scheduling-policy name` selects (a policy object is taken as it is);
    effort's lanes from `effort_lane_bounds` ("512,2048"; empty: EFFORT_LANE_BOUNDS)."""
    if isinstance(name, QueuePolicy):
        return name
    if name == "fcfs":
        return FcfsPolicy()
    if name == "priority":
        return PriorityPolicy()
    if name == "effort":
        if not effort_lane_bounds:
            return EffortPolicy(max_num_seqs, max_model_len)
        try:
            bounds = tuple(int(bound) for bound in effort_lane_bounds.split(","))
        except ValueError:
            raise ValueError(
                f"effort_lane_bounds must be comma-separated token counts, got {effort_lane_bounds!r}"
            ) from None
        return EffortPolicy(max_num_seqs, max_model_len, bounds)
    raise ValueError(f"unknown scheduling policy {name!r}")
