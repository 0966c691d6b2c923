"""The scheduler: token budgets, decode-first chunked prefill, preemption, policies, and
the results of a step applied through the real `update_from_output`."""

from __future__ import annotations

import itertools
import pickle

from accord.core.sched.block_manager import BlockManager
from accord.core.sampling_params import SamplingParams
from accord.core.sched.output import ModelRunnerOutput, SchedulerOutput
from accord.core.sched.check_stop import check_stop
from accord.core.sched.scheduler import Scheduler
from accord.core.sched.request import Request, RequestStatus

BLOCK_SIZE = 4
_arrivals = itertools.count()


def make_seq(num_prompt_tokens: int, priority: int = 0, first_token: int = 1) -> Request:
    order = next(_arrivals)
    return Request(
        req_id=f"s{order}",
        index=0,
        prompt_token_ids=list(range(first_token, first_token + num_prompt_tokens)),
        params=SamplingParams(),
        priority=priority,
        arrival_order=order,
        arrival_time=float(order),
    )


def make_scheduler(num_blocks: int = 64, budget: int = 16, max_num_seqs: int = 8, policy: str = "fcfs") -> Scheduler:
    return Scheduler(BlockManager(num_blocks, BLOCK_SIZE), budget, max_num_seqs, policy)  # type: ignore[arg-type]


def run_step(scheduler: Scheduler, token: int = 0) -> SchedulerOutput:
    """Schedule, then play the model: every sequence whose scheduled tokens reach the
    end of its tokens (it holds a placeholder for the token sampled) samples `token`;
    the scheduler applies that result."""
    out = scheduler.schedule()
    samplers = [seq_id for seq_id in out.num_scheduled_tokens if scheduler.requests[seq_id].num_output_placeholders]
    result = ModelRunnerOutput(
        req_ids=samplers,
        sampled_token_ids=[token] * len(samplers),
        logprobs=[0.0] * len(samplers),
        top_logprobs=[None] * len(samplers),
    )
    scheduler.update_from_output(out, result)
    return out


def test_a_step_never_exceeds_the_token_budget() -> None:
    scheduler = make_scheduler(budget=16)
    for length in (10, 10, 10):
        scheduler.add_request(make_seq(length))
    assert run_step(scheduler).total_num_scheduled_tokens == 16


def test_a_long_prompt_is_chunked_across_steps() -> None:
    scheduler = make_scheduler(budget=16)
    seq = make_seq(40)
    scheduler.add_request(seq)
    counts = [run_step(scheduler).num_scheduled_tokens[seq.req_id] for _ in range(3)]
    assert counts == [16, 16, 8]
    assert seq.num_output_tokens == 1


def test_a_long_prompt_never_stalls_running_decodes() -> None:
    scheduler = make_scheduler(budget=16)
    short = make_seq(3)
    scheduler.add_request(short)
    run_step(scheduler)
    long_prompt = make_seq(100, first_token=200)
    scheduler.add_request(long_prompt)
    for _ in range(3):
        out = run_step(scheduler)
        assert out.num_scheduled_tokens == {short.req_id: 1, long_prompt.req_id: 15}


def test_max_num_seqs_caps_the_running_set() -> None:
    scheduler = make_scheduler(budget=64, max_num_seqs=2)
    for _ in range(3):
        scheduler.add_request(make_seq(2))
    assert len(run_step(scheduler).num_scheduled_tokens) == 2
    assert len(scheduler.waiting) == 1


def test_running_out_of_blocks_preempts_the_youngest_of_equal_rebuild_cost() -> None:
    scheduler = make_scheduler(num_blocks=2, budget=16)
    old, young = make_seq(4), make_seq(4, first_token=50)
    scheduler.add_request(old)
    scheduler.add_request(young)
    run_step(scheduler)  # both prefilled: one block each, all blocks in use
    out = run_step(scheduler)  # old needs a second block for its decode
    assert out.preempted_req_ids == {young.req_id}
    assert young.status is RequestStatus.WAITING and young.num_computed_tokens == 0
    assert list(out.num_scheduled_tokens) == [old.req_id]


def test_priority_policy_preempts_the_lowest_priority_first() -> None:
    scheduler = make_scheduler(num_blocks=2, budget=16, policy="priority")
    important, unimportant = make_seq(4, priority=0), make_seq(4, priority=5, first_token=50)
    scheduler.add_request(unimportant)
    scheduler.add_request(important)
    run_step(scheduler)
    assert run_step(scheduler).preempted_req_ids == {unimportant.req_id}


def test_priority_policy_admits_higher_priority_first() -> None:
    scheduler = make_scheduler(budget=4, policy="priority")
    late_but_urgent = make_seq(4, priority=-1)
    early = make_seq(4, priority=3)
    scheduler.add_request(early)
    scheduler.add_request(late_but_urgent)
    assert list(run_step(scheduler).num_scheduled_tokens) == [late_but_urgent.req_id]


def test_a_preempted_sequence_resumes_from_its_surviving_cached_blocks() -> None:
    scheduler = make_scheduler(num_blocks=4, budget=32)
    old, young = make_seq(8), make_seq(7, first_token=50)
    scheduler.add_request(old)
    scheduler.add_request(young)
    run_step(scheduler)  # old: 2 blocks, young: 2 blocks, all in use
    run_step(scheduler)  # old's decode needs a third block: young is preempted
    scheduler.finish_requests([old.req_id], "abort")
    out = scheduler.schedule()
    # young's first full block (tokens 50..53) was cached and survived: 4 of its 8 tokens remain.
    (resumed,) = out.scheduled_new_reqs
    assert resumed.num_computed_tokens == BLOCK_SIZE
    assert out.num_scheduled_tokens[young.req_id] == young.num_tokens - BLOCK_SIZE == 4


def test_finishing_frees_every_block() -> None:
    scheduler = make_scheduler()
    seqs = [make_seq(9), make_seq(5)]
    for seq in seqs:
        scheduler.add_request(seq)
    run_step(scheduler)
    for seq in seqs:
        scheduler.finish_requests([seq.req_id], "abort")
    assert scheduler.block_manager.num_free_blocks == scheduler.block_manager.num_blocks
    assert scheduler.num_unfinished == 0


# -- the plain-data step contract ---------------------------------------------------------


def test_a_new_sequence_is_sent_in_full_then_only_as_diffs() -> None:
    scheduler = make_scheduler(budget=16)
    seq = make_seq(6)
    scheduler.add_request(seq)
    first = run_step(scheduler)
    [new] = first.scheduled_new_reqs
    assert (new.req_id, new.prompt_token_ids, new.num_computed_tokens) == (seq.req_id, seq.prompt_token_ids, 0)
    assert new.block_ids == scheduler.block_manager.block_table(seq.req_id)
    assert new.sampling_params is seq.params
    second = run_step(scheduler)  # token 7 of 8 in the block pair: no new block
    assert second.scheduled_new_reqs == []
    cached = second.scheduled_cached_reqs
    assert (cached.req_ids, cached.new_block_ids, cached.num_computed_tokens) == ([seq.req_id], [[]], [6])
    run_step(scheduler)
    fourth = run_step(scheduler)  # the 9th token starts a third block: only that block is sent
    assert fourth.scheduled_cached_reqs.new_block_ids == [scheduler.block_manager.block_table(seq.req_id)[2:]]


def test_finished_ids_reach_the_runner_once_and_preempted_ones_come_back_in_full() -> None:
    scheduler = make_scheduler(num_blocks=2, budget=16)
    old, young = make_seq(4), make_seq(4, first_token=50)
    scheduler.add_request(old)
    scheduler.add_request(young)
    run_step(scheduler, token=9)
    out = run_step(scheduler)
    assert out.preempted_req_ids == {young.req_id}
    scheduler.finish_requests([old.req_id], "abort")
    resumed = run_step(scheduler)
    assert resumed.finished_req_ids == {old.req_id}
    [new] = resumed.scheduled_new_reqs
    assert new.req_id == young.req_id and new.output_token_ids == [9]
    assert run_step(scheduler).finished_req_ids == set()


def test_a_steady_decode_step_pickles_to_ids_and_counts_only() -> None:
    """No token lists once running: the pickled step grows with the batch, not with
    the prompts' lengths."""

    def steady_step_bytes(prompt_len: int) -> int:
        scheduler = make_scheduler(num_blocks=4096, budget=8192, max_num_seqs=64)
        for _ in range(64):
            scheduler.add_request(make_seq(prompt_len))
        run_step(scheduler)
        run_step(scheduler)
        out = run_step(scheduler)
        assert len(out.num_scheduled_tokens) == 64 and not out.scheduled_new_reqs
        return len(pickle.dumps(out))

    # Both lengths leave the third step inside its last block (no block ids to send);
    # 300 more tokens a prompt would add kilobytes if any token list travelled, while a
    # wider num_computed_tokens integer costs a byte or two per request.
    short, long = steady_step_bytes(9), steady_step_bytes(309)
    assert long - short <= 2 * 64


def test_update_from_output_stops_on_max_tokens_and_frees_blocks() -> None:
    scheduler = make_scheduler()
    seq = make_seq(3)
    seq.params = SamplingParams(max_tokens=2, ignore_eos=True)
    scheduler.add_request(seq)
    run_step(scheduler)
    assert not seq.is_finished and seq.output_token_ids == [0]
    out = run_step(scheduler)
    assert seq.finish_reason == "length" and seq.output_token_ids == [0, 0]
    assert scheduler.num_unfinished == 0 and scheduler.block_manager.num_used_blocks == 0
    assert seq.num_computed_tokens == 4 and out.num_scheduled_tokens == {seq.req_id: 1}


def test_check_stop_reports_eos_without_a_stop_reason_and_other_stop_tokens_with_one() -> None:
    seq = make_seq(3)
    seq.params = SamplingParams(stop_token_ids=[5], min_tokens=1).for_child(0, {2})
    seq.append_token(2)
    assert check_stop(seq, None, {2}) == ("stop", None)
    seq.append_token(5)
    assert check_stop(seq, None, {2}) == ("stop", 5)
    seq.append_token(7)
    assert check_stop(seq, None, {2}) is None
    assert check_stop(seq, seq.num_tokens, {2}) == ("length", None)


def test_check_stop_ignores_stop_tokens_before_min_tokens() -> None:
    seq = make_seq(3)
    seq.params = SamplingParams(min_tokens=2).for_child(0, {2})
    seq.append_token(2)
    assert check_stop(seq, None, {2}) is None
