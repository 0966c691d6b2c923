"""Which running request the scheduler preempts when blocks run out (scheduler alone,
no model): the one whose KV is cheapest to rebuild. Without a KV tier that is the
shortest context (recomputed); with the CPU tier holding a long context's blocks, the
long one (swapped back in from the tier, not recomputed). The policy's class ranks
first (priority's lowest priority); equal costs fall back to the youngest. Each
preemption is counted by its reason, and each request's queue time by its lane."""

from __future__ import annotations

import itertools

from accord.core.kv_transfer.config import offloading_config
from accord.core.kv_transfer.offload import OffloadingScheduler
from accord.core.sampling_params import SamplingParams
from accord.core.sched.block_manager import BlockManager
from accord.core.sched.output import ModelRunnerOutput
from accord.core.sched.policy import EffortPolicy
from accord.core.sched.request import Request
from accord.core.sched.scheduler import Scheduler
from accord.core.thinking import ThinkingMarkers

BLOCK_SIZE = 4
_ids = itertools.count()


def make_request(prompt_len: int, first_token: int = 10, **params) -> Request:
    order = next(_ids)
    prompt = list(range(first_token, first_token + prompt_len))
    return Request(f"r{order}", prompt, SamplingParams(max_tokens=64, ignore_eos=True, **params), arrival_order=order)


def step(sched: Scheduler):
    out = sched.schedule()
    samplers = [rid for rid in out.num_scheduled_tokens if sched.requests[rid].num_output_placeholders]
    sched.update_from_output(out, ModelRunnerOutput(
        req_ids=samplers, sampled_token_ids=[7] * len(samplers), logprobs=[0.0] * len(samplers),
        top_logprobs=[None] * len(samplers)))
    return out


def short_old_and_long_young(sched: Scheduler) -> tuple[Request, Request]:
    """A 3-token request, then a 12-token one, prefilled together in 4 blocks of 4: the
    long one's first decode needs a fifth block."""
    short, long = make_request(3), make_request(12, first_token=100)
    sched.add_request(short)
    sched.add_request(long)
    step(sched)
    return short, long


def test_without_a_kv_tier_the_short_context_is_preempted_even_when_older() -> None:
    sched = Scheduler(BlockManager(4, BLOCK_SIZE), max_num_batched_tokens=64, max_num_seqs=4)
    short, long = short_old_and_long_young(sched)
    assert (sched.rebuild_cost(short), sched.rebuild_cost(long)) == (3, 12)
    out = step(sched)
    assert out.preempted_req_ids == {short.req_id} and list(out.num_scheduled_tokens) == [long.req_id]
    assert sched.stats.preemptions_by_reason == {"kv_cache_full": 1} and sched.stats.num_preemptions == 1


def test_with_the_cpu_tier_holding_its_blocks_the_long_context_is_swapped_out() -> None:
    tier = OffloadingScheduler(offloading_config(1 / 1024), BLOCK_SIZE, bytes_per_block=1024)
    sched = Scheduler(BlockManager(4, BLOCK_SIZE), max_num_batched_tokens=64, max_num_seqs=4, kv_connector=tier)
    short, long = short_old_and_long_young(sched)
    # The tier wrote the long prompt's 3 full blocks through: only its decode token is lost.
    assert tier.blocks_stored == 3
    assert (sched.rebuild_cost(short), sched.rebuild_cost(long)) == (3, 0)
    out = step(sched)
    assert out.preempted_req_ids == {long.req_id} and list(out.num_scheduled_tokens) == [short.req_id]


def test_blocks_another_request_holds_cost_nothing_to_rebuild() -> None:
    sched = Scheduler(BlockManager(16, BLOCK_SIZE), max_num_batched_tokens=64, max_num_seqs=4)
    first = make_request(9)
    sched.add_request(first)
    step(sched)
    second = make_request(9)  # the same 9 tokens: its first 2 blocks are first's
    sched.add_request(second)
    step(sched)
    assert second.num_cached_tokens == 8
    assert sched.rebuild_cost(first) == first.num_computed_tokens - 8 == 2
    assert sched.rebuild_cost(second) == second.num_computed_tokens - 8 == 1
    sched.finish_requests([first.req_id], "abort")  # now second alone holds them
    assert sched.rebuild_cost(second) == second.num_computed_tokens == 9


def test_the_priority_class_ranks_above_the_rebuild_cost() -> None:
    sched = Scheduler(BlockManager(4, BLOCK_SIZE), max_num_batched_tokens=64, max_num_seqs=4, policy="priority")
    cheap_urgent, costly_unimportant = make_request(3), make_request(12, first_token=100)
    costly_unimportant.priority = 5
    sched.add_request(cheap_urgent)
    sched.add_request(costly_unimportant)
    step(sched)
    assert step(sched).preempted_req_ids == {costly_unimportant.req_id}


def test_queue_time_is_observed_once_per_request_under_its_lane() -> None:
    now = [0.0]
    markers = ThinkingMarkers(start_id=90, end_id=91)
    policy = EffortPolicy(max_num_seqs=1, max_model_len=None, lane_bounds=(64, 256))
    sched = Scheduler(BlockManager(64, BLOCK_SIZE), max_num_batched_tokens=64, max_num_seqs=1, policy=policy,
                      clock=lambda: now[0])
    low = make_request(3, thinking_markers=markers, thinking_token_budget=8)
    low.params.max_tokens = 4
    high = make_request(3, first_token=50, thinking_markers=markers, thinking_token_budget=300)
    for request in (high, low):
        sched.add_request(request)
    now[0] = 0.4
    step(sched)  # low (lane 0) first: 0.4 s queued
    while low.req_id in sched.requests:
        step(sched)
    now[0] = 3.0
    step(sched)  # then high (lane 2): 3 s queued
    step(sched)
    lanes = sched.stats.lane_queue_time
    assert sorted(lanes) == [0, 2]
    assert (sum(lanes[0].counts), lanes[0].total) == (1, 0.4) and (sum(lanes[2].counts), lanes[2].total) == (1, 3.0)
    assert lanes[0].counts[1] == 1 and lanes[2].counts[7] == 1  # buckets (0.3, 0.5] and (2.5, 5]
