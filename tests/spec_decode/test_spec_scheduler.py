"""The scheduler with speculative decoding: a request with drafts schedules 1 + k
tokens, trimmed to max_tokens, the context and the budget; rejected drafts leave
num_computed_tokens, accepted ones advance it; drafts are never cached as prefix
blocks; large batches get none (disable_by_batch_size); without drafts a step is the
step the scheduler builds without speculation."""

from __future__ import annotations

from accord.core.sampling_params import SamplingParams
from accord.core.sched.block_manager import BlockManager
from accord.core.sched.output import ModelRunnerOutput, SchedulerOutput
from accord.core.sched.request import Request
from accord.core.sched.scheduler import Scheduler
from accord.core.spec_decode.config import SpeculativeConfig

BLOCK_SIZE = 4


def make_scheduler(budget: int = 32, num_blocks: int = 64, **spec: object) -> Scheduler:
    config = SpeculativeConfig.parse({"method": "ngram", "num_speculative_tokens": 4, **spec})
    return Scheduler(BlockManager(num_blocks, BLOCK_SIZE), budget, 8, speculative=config, max_model_len=64)


def add(scheduler: Scheduler, req_id: str, prompt: list[int], **params: object) -> Request:
    # for_child: the settings as the engine hands them over (stop token ids gathered).
    request = Request(req_id, prompt, SamplingParams(**params).for_child(0, set()))  # type: ignore[arg-type]
    scheduler.add_request(request)
    return request


def land(scheduler: Scheduler, step: SchedulerOutput, emitted: dict[str, list[int]],
         drafts: dict[str, list[int]] | None = None, step_seconds: float | None = None) -> None:
    """Apply a step whose requests emitted these tokens (accepted drafts, then one),
    having run for `step_seconds` (None: not timed)."""
    req_ids = [req_id for req_id, tokens in emitted.items() for _ in tokens]
    tokens = [token for tokens in emitted.values() for token in tokens]
    result = ModelRunnerOutput(req_ids=req_ids, sampled_token_ids=tokens, logprobs=[None] * len(tokens),
                               top_logprobs=[None] * len(tokens), draft_token_ids=drafts or {})
    scheduler.update_from_output(step, result, step_seconds)


def decoding(scheduler: Scheduler, prompt: list[int], drafts: list[int], **params: object) -> Request:
    """A request past its prompt (first token 100 landed) holding `drafts`."""
    request = add(scheduler, "r", prompt, **params)
    land(scheduler, scheduler.schedule(), {"r": [100]}, {"r": drafts})
    return request


def test_a_request_with_drafts_schedules_one_token_more_than_its_drafts() -> None:
    scheduler = make_scheduler()
    decoding(scheduler, [1, 2, 3, 4, 5], [6, 7, 8])
    step = scheduler.schedule()
    assert step.num_scheduled_tokens == {"r": 4}
    assert step.scheduled_spec_decode_tokens == {"r": [6, 7, 8]}


def test_rejected_drafts_leave_the_computed_count_and_accepted_ones_advance_it() -> None:
    scheduler = make_scheduler()
    request = decoding(scheduler, [1, 2, 3, 4, 5], [6, 7, 8])
    step = scheduler.schedule()  # computes 100, 6, 7, 8 at positions 5..8
    land(scheduler, step, {"r": [6, 9]})  # 6 accepted, 7 rejected (9 emitted instead)
    assert request.output_token_ids == [100, 6, 9]
    # Positions 0..6 hold KV of known tokens (7 is the new token 9, not computed yet).
    assert request.num_computed_tokens == 7 == request.num_tokens - 1
    assert scheduler.stats.spec_decode_num_draft_tokens == 3
    assert scheduler.stats.spec_decode_num_accepted_tokens == 1
    assert scheduler.stats.spec_decode_num_accepted_tokens_per_pos == [1, 0, 0]
    next_step = scheduler.schedule()  # no new drafts: one token, at position 7
    assert next_step.num_scheduled_tokens == {"r": 1} and next_step.scheduled_cached_reqs.num_computed_tokens == [7]


def test_drafts_are_cut_so_the_step_cannot_pass_max_tokens() -> None:
    scheduler = make_scheduler()
    decoding(scheduler, [1, 2, 3], [6, 7, 8], max_tokens=3)  # one token out, two allowed
    step = scheduler.schedule()
    assert step.scheduled_spec_decode_tokens == {"r": [6]} and step.num_scheduled_tokens == {"r": 2}


def test_drafts_are_cut_to_the_context_limit() -> None:
    scheduler = make_scheduler(budget=64)
    decoding(scheduler, list(range(1, 61)), [6, 7, 8, 9])  # 61 tokens of max_model_len 64
    assert scheduler.schedule().scheduled_spec_decode_tokens == {"r": [6, 7]}


def test_drafts_are_cut_to_the_token_budget() -> None:
    scheduler = make_scheduler(budget=3)
    decoding(scheduler, [1, 2], [6, 7, 8, 9])
    assert scheduler.schedule().num_scheduled_tokens == {"r": 3}


def test_a_batch_at_disable_by_batch_size_checks_no_drafts() -> None:
    scheduler = make_scheduler(disable_by_batch_size=2)
    add(scheduler, "a", [1, 2, 3])
    add(scheduler, "b", [4, 5, 6])
    land(scheduler, scheduler.schedule(), {"a": [7], "b": [8]}, {"a": [1, 2], "b": [3, 4]})
    step = scheduler.schedule()
    assert step.scheduled_spec_decode_tokens == {} and step.num_scheduled_tokens == {"a": 1, "b": 1}


def test_a_step_without_drafts_is_the_step_without_speculation() -> None:
    with_spec = make_scheduler()
    without = Scheduler(BlockManager(64, BLOCK_SIZE), 32, 8, max_model_len=64)
    for scheduler in (with_spec, without):
        add(scheduler, "a", [1, 2, 3, 4, 5])
        land(scheduler, scheduler.schedule(), {"a": [9]})
    assert with_spec.schedule() == without.schedule()


def test_drafts_never_enter_the_prefix_cache() -> None:
    scheduler = make_scheduler()
    manager = scheduler.block_manager
    decoding(scheduler, [1, 2, 3], [6, 7, 8])  # tokens 1 2 3 100; drafts fill block 1 with 6 7 8
    land(scheduler, scheduler.schedule(), {"r": [50]})  # every draft rejected
    scheduler.schedule()  # caches what the known tokens fill: block 0 only
    assert len(manager.find_cached_prefix([1, 2, 3, 100, 6, 7, 8, 0, 0], 8)) == 1
    assert len(manager.find_cached_prefix([1, 2, 3, 100, 50, 0, 0, 0, 0], 8)) == 1


def test_accepted_drafts_enter_the_prefix_cache() -> None:
    scheduler = make_scheduler()
    manager = scheduler.block_manager
    decoding(scheduler, [1, 2, 3], [6, 7, 8])
    land(scheduler, scheduler.schedule(), {"r": [6, 7, 8, 9]})  # all accepted, 9 the bonus
    scheduler.schedule()
    assert len(manager.find_cached_prefix([1, 2, 3, 100, 6, 7, 8, 9, 0], 8)) == 2


def test_a_preempted_request_drops_its_drafts() -> None:
    scheduler = make_scheduler()
    request = decoding(scheduler, [1, 2, 3], [6, 7, 8])
    scheduler._preempt(request, "kv_cache_full")
    assert request.spec_token_ids == [] and scheduler.schedule().scheduled_spec_decode_tokens == {}


def test_finishing_at_an_accepted_stop_token_drops_the_tokens_after_it() -> None:
    scheduler = make_scheduler()
    request = decoding(scheduler, [1, 2, 3], [6, 7, 8], stop_token_ids=[7])
    land(scheduler, scheduler.schedule(), {"r": [6, 7, 8, 9]})
    assert request.output_token_ids == [100, 6, 7] and request.finish_reason == "stop"
    assert scheduler.block_manager.num_free_blocks == scheduler.block_manager.num_blocks


def test_drafts_take_only_the_budget_other_decodes_do_not_need() -> None:
    scheduler = make_scheduler(budget=5)
    for req_id, prompt in (("a", [1]), ("b", [3]), ("c", [5])):
        add(scheduler, req_id, prompt)
    land(scheduler, scheduler.schedule(), {"a": [7], "b": [8], "c": [9]}, {"a": [1, 2, 3], "b": [4, 5], "c": [6]})
    step = scheduler.schedule()
    # Five tokens for three decodes: each gets its token, and the two left go to drafts.
    assert step.num_scheduled_tokens == {"a": 3, "b": 1, "c": 1}
