"""`--scheduling-policy effort` through the scheduler alone (no model, no clock): under
a mixed load of 4 high-effort thinking streams and 32 low-effort requests, a low-effort
request never waits while high-effort ones hold more than their lane's share of the
sequences, and waits far fewer steps than under FCFS; the effort order is shortest
remaining expected decode first."""

from __future__ import annotations

import itertools
import statistics

import pytest
from hypothesis import given
from hypothesis import strategies as st

from accord.core.sampling_params import SamplingParams
from accord.core.sched.block_manager import BlockManager
from accord.core.sched.output import ModelRunnerOutput
from accord.core.sched.policy import EffortPolicy, make_policy
from accord.core.sched.request import Request
from accord.core.sched.scheduler import Scheduler
from accord.core.thinking import ThinkingMarkers

#: The played model never samples these, so the thinking runs to its budget.
MARKERS = ThinkingMarkers(start_id=90, end_id=91)
SAMPLED_TOKEN = 7
MAX_NUM_SEQS = 4
#: Lanes: expected decode up to 64 tokens, up to 256, beyond (shares 1, 1/2, 1/4).
LANE_BOUNDS = (64, 256)
HIGH = {"thinking_token_budget": 300, "max_tokens": 20}  # 321 expected: the longest lane
LOW = {"thinking_token_budget": 16, "max_tokens": 8}  # 25 expected: the shortest lane
_arrivals = itertools.count()


def request(effort: dict[str, int], arrival: int) -> Request:
    order = next(_arrivals)
    params = SamplingParams(thinking_markers=MARKERS, **effort)
    return Request(f"r{order}", [1, 2, 3, 4], params, arrival_time=float(arrival), arrival_order=order)


def scheduler(policy: str | EffortPolicy) -> Scheduler:
    return Scheduler(BlockManager(512, 16), max_num_batched_tokens=256, max_num_seqs=MAX_NUM_SEQS, policy=policy)


def play_step(sched: Scheduler) -> set[str]:
    """One step with every sampling request sampling SAMPLED_TOKEN; returns the ids scheduled."""
    out = sched.schedule()
    samplers = [rid for rid in out.num_scheduled_tokens if sched.requests[rid].num_output_placeholders]
    sched.update_from_output(out, ModelRunnerOutput(
        req_ids=samplers, sampled_token_ids=[SAMPLED_TOKEN] * len(samplers),
        logprobs=[0.0] * len(samplers), top_logprobs=[None] * len(samplers),
    ))
    return set(out.num_scheduled_tokens)


def mixed_load(policy: str | EffortPolicy) -> tuple[dict[str, int], list[int]]:
    """The 4 high-effort streams start first; 5 steps later the 32 low-effort requests
    arrive. Returns the steps each low-effort request waited for its first step, and per
    step while a low-effort request waited, how many high-effort requests ran."""
    sched = scheduler(policy)
    highs = [request(HIGH, 0) for _ in range(4)]
    for high in highs:
        sched.add_request(high)
    for _ in range(5):
        play_step(sched)
    lows = [request(LOW, 5) for _ in range(32)]
    for low in lows:
        sched.add_request(low)
    waited = {low.req_id: 0 for low in lows}
    started: set[str] = set()
    high_running_while_lows_wait = []
    high_ids = {high.req_id for high in highs}
    for _ in range(5000):
        if not sched.requests:
            break
        waiting_lows = set(waited) - started
        scheduled = play_step(sched)
        started |= scheduled & set(waited)
        for rid in waiting_lows - scheduled:
            waited[rid] += 1
        if waiting_lows - scheduled:
            high_running_while_lows_wait.append(len(scheduled & high_ids))
    assert not sched.requests, "the load did not drain"
    assert all(high.num_output_tokens == 321 for high in highs)  # budget + end marker + max_tokens
    return waited, high_running_while_lows_wait


@pytest.fixture(scope="module")
def under_fcfs() -> tuple[dict[str, int], list[int]]:
    return mixed_load("fcfs")


@pytest.fixture(scope="module")
def under_effort() -> tuple[dict[str, int], list[int]]:
    return mixed_load(EffortPolicy(MAX_NUM_SEQS, None, lane_bounds=LANE_BOUNDS))


def test_under_fcfs_low_effort_requests_wait_behind_every_high_effort_stream(under_fcfs) -> None:
    waited, high_running = under_fcfs
    assert max(high_running) == 4  # all four slots held by thinking streams while lows wait
    assert min(waited.values()) >= 300  # nobody starts before a high-effort stream ends


def test_under_effort_high_effort_streams_keep_to_their_lane_share_while_lows_wait(under_effort) -> None:
    waited, high_running = under_effort
    assert high_running and max(high_running) <= 1  # a quarter of the 4 sequences


def test_effort_cuts_the_low_effort_wait_against_fcfs(under_fcfs, under_effort) -> None:
    fcfs_wait, effort_wait = under_fcfs[0], under_effort[0]
    print(f"low-effort steps waited: fcfs mean {statistics.mean(fcfs_wait.values()):.0f} "
          f"max {max(fcfs_wait.values())}; effort mean {statistics.mean(effort_wait.values()):.0f} "
          f"max {max(effort_wait.values())}")
    # Three slots for lows from their arrival: the last of 32 starts after ~10 rounds of ~25 steps.
    assert max(effort_wait.values()) < min(fcfs_wait.values())
    assert statistics.mean(effort_wait.values()) * 3 < statistics.mean(fcfs_wait.values())


def test_effort_orders_waiting_requests_by_remaining_expected_decode() -> None:
    sched = scheduler(EffortPolicy(1, None, lane_bounds=LANE_BOUNDS))
    first, long_one, short_one = request(LOW, 0), request(HIGH, 1), request({"max_tokens": 5}, 2)
    for item in (first, long_one, short_one):
        sched.add_request(item)
    assert [r.req_id for r in sched.waiting] == [short_one.req_id, first.req_id, long_one.req_id]


def test_the_answer_budget_follows_the_thinking_when_it_ends_early() -> None:
    # The thinking ends by itself after 2 tokens: max_tokens counts from there.
    sched = scheduler("fcfs")
    item = request({"thinking_token_budget": 10, "max_tokens": 3}, 0)
    sched.add_request(item)
    for token in (5, 6, MARKERS.end_id, 8, 8, 8, 8):
        out = sched.schedule()
        if item.req_id not in sched.requests:
            break
        sched.update_from_output(out, ModelRunnerOutput(
            req_ids=[item.req_id], sampled_token_ids=[token], logprobs=[0.0], top_logprobs=[None]))
    assert item.output_token_ids == [5, 6, MARKERS.end_id, 8, 8, 8]
    assert item.finish_reason == "length"


def test_the_lane_bounds_come_from_the_engine_setting() -> None:
    policy = make_policy("effort", 8, None, "64,256")
    assert isinstance(policy, EffortPolicy) and policy.lane_bounds == (64, 256)
    assert [policy.lane(request(LOW, 0)), policy.lane(request(HIGH, 0))] == [0, 2]


@pytest.mark.parametrize("bounds", ["64,x", "256,64"])
def test_malformed_lane_bounds_are_refused(bounds: str) -> None:
    with pytest.raises(ValueError, match="effort lane bounds|effort_lane_bounds"):
        make_policy("effort", 8, None, bounds)


@given(st.lists(st.tuples(st.sampled_from([25, 100, 321, None]), st.integers(0, 320)), min_size=1, max_size=12))
def test_the_shortest_waiting_lane_is_found_without_reading_the_whole_queue(efforts) -> None:
    """The early-stopping scan agrees with the minimum over every waiting request, for
    any queue in the policy's order (preempted requests, with output, included)."""
    policy = EffortPolicy(MAX_NUM_SEQS, 400, lane_bounds=LANE_BOUNDS)
    waiting = []
    for max_tokens, produced in efforts:
        item = request({"max_tokens": max_tokens} if max_tokens else {}, 0)
        for _ in range(min(produced, (max_tokens or 396) - 1)):
            item.append_token(SAMPLED_TOKEN)
        waiting.append(item)
    waiting.sort(key=policy.order_key)
    assert policy.shortest_lane(waiting) == min(policy.lane(item) for item in waiting)
