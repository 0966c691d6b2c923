"""`--max-thinking-tokens-per-tenant` through the scheduler alone (no model, no clock):
a tenant's running requests that still think hold together at most the cap's remaining
thinking-budget tokens; a request past it waits while another tenant's are admitted; a
request whose budget alone exceeds the cap is admitted alone, and the load drains."""

from __future__ import annotations

import itertools

from accord.core.sampling_params import SamplingParams
from accord.core.sched.block_manager import BlockManager
from accord.core.sched.output import ModelRunnerOutput
from accord.core.sched.request import Request
from accord.core.sched.scheduler import Scheduler
from accord.core.thinking import ThinkingMarkers, forced_thinking_token

#: The played model samples neither by itself (the end marker only when forced).
MARKERS = ThinkingMarkers(start_id=90, end_id=91)
SAMPLED_TOKEN = 7
CAP = 250
HIGH = {"thinking_token_budget": 100, "max_tokens": 4}
LOW = {"thinking_token_budget": 8, "max_tokens": 4}
_orders = itertools.count()


def request(tenant: str | None, effort: dict[str, int]) -> Request:
    order = next(_orders)
    params = SamplingParams(thinking_markers=MARKERS, **effort)
    return Request(f"{tenant}-{order}", [1, 2, 3, 4], params, arrival_order=order, tenant=tenant)


def scheduler(cap: int | None = CAP, max_num_seqs: int = 16) -> Scheduler:
    return Scheduler(BlockManager(1024, 16), max_num_batched_tokens=512, max_num_seqs=max_num_seqs,
                     max_thinking_tokens_per_tenant=cap)


def held_by(sched: Scheduler, tenant: str) -> int:
    """Remaining thinking-budget tokens of the tenant's running requests that still think
    (counted here from the budgets and the tokens sampled, not by the scheduler's sum)."""
    return sum(r.params.thinking_token_budget - len(r.output_token_ids)
               for r in sched.running if r.tenant == tenant and MARKERS.end_id not in r.output_token_ids)


def drain(sched: Scheduler, requests: list[Request], watch: str) -> tuple[dict[str, int], int, list[int]]:
    """Run the load to the end, every sampling request sampling SAMPLED_TOKEN (the
    thinking runs to its budget); returns
    each request's first scheduled step, the most of `watch`'s requests that thought at
    once, and `watch`'s held budget after each step's admissions."""
    for item in requests:
        sched.add_request(item)
    first_step: dict[str, int] = {}
    most_thinking, held = 0, []
    for step in range(2000):
        if not sched.requests:
            break
        out = sched.schedule()
        for rid in out.num_scheduled_tokens:
            first_step.setdefault(rid, step)
        held.append(held_by(sched, watch))
        most_thinking = max(most_thinking, sum(
            1 for r in sched.running if r.tenant == watch and MARKERS.end_id not in r.output_token_ids))
        samplers = [sched.requests[rid] for rid in out.num_scheduled_tokens
                    if sched.requests[rid].num_output_placeholders]
        # The sampler forces the end marker once a budget is spent.
        tokens = [forced_thinking_token(MARKERS, r.params.thinking_token_budget, r.prompt_token_ids,
                                        r.output_token_ids) or SAMPLED_TOKEN for r in samplers]
        sched.update_from_output(out, ModelRunnerOutput(
            req_ids=[r.req_id for r in samplers], sampled_token_ids=tokens,
            logprobs=[0.0] * len(samplers), top_logprobs=[None] * len(samplers),
        ))
    assert not sched.requests, "the load did not drain"
    assert all(r.num_output_tokens == r.params.thinking_token_budget + 1 + r.params.max_tokens for r in requests)
    return first_step, most_thinking, held


def test_a_tenants_thinking_requests_keep_to_the_cap_and_the_other_tenant_is_not_starved() -> None:
    highs = [request("a", HIGH) for _ in range(10)]
    lows = [request("b", LOW) for _ in range(6)]  # arrive after all of A's
    first_step, most_thinking, held = drain(scheduler(), highs + lows, watch="a")
    assert max(held) <= CAP
    # Two fit the cap at first; more join as their remaining budgets shrink, never all ten.
    assert sum(first_step[h.req_id] == 0 for h in highs) == CAP // HIGH["thinking_token_budget"] == 2
    assert 2 < most_thinking < 10
    assert all(first_step[low.req_id] == 0 for low in lows)  # B is admitted at once, beside A's two
    assert max(first_step[h.req_id] for h in highs) > HIGH["thinking_token_budget"]  # waits out others


def test_without_the_cap_the_same_load_runs_every_thinking_request_at_once() -> None:
    highs = [request("a", HIGH) for _ in range(10)]
    _, most_thinking, held = drain(scheduler(cap=None), highs, watch="a")
    assert most_thinking == 10 and max(held) > 3 * CAP


def test_a_request_past_the_cap_alone_is_admitted_alone_and_nothing_deadlocks() -> None:
    budget = 3 * CAP
    big = [request("a", {"thinking_token_budget": budget, "max_tokens": 2}) for _ in range(2)]
    small = request("a", LOW)
    first_step, _, held = drain(scheduler(), big + [small], watch="a")
    assert first_step[big[0].req_id] == 0
    # The second waits out the first's whole thinking (its budget and the forced end marker).
    assert first_step[big[1].req_id] == budget + 1
    # The small one joins the first once the first's rest and its own budget fit the cap.
    assert first_step[small.req_id] == budget - (CAP - LOW["thinking_token_budget"])
    assert max(held[first_step[small.req_id]:first_step[big[1].req_id]]) <= CAP


def test_requests_of_no_tenant_are_not_capped() -> None:
    anonymous = [request(None, HIGH) for _ in range(5)]
    first_step, _, _ = drain(scheduler(cap=50), anonymous, watch="a")
    assert set(first_step.values()) == {0}
