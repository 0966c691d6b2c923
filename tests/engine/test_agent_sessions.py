"""Agent sessions in the prefix cache (scheduler and block manager alone, no model):
a session's freed blocks outlive one-off requests' (LRU per session, not global), so
two agent sessions alternating turns under a tight KV budget, with one-off requests
churning between the turns, prefill only each turn's new tokens; without session ids
the churn evicts their history. `cache_salt` keeps differently salted requests from
sharing blocks."""

from __future__ import annotations

import itertools
import random

import pytest

from accord.core.cache_affinity import CacheAffinity
from accord.core.sampling_params import SamplingParams
from accord.core.sched.block_manager import BlockManager
from accord.core.sched.output import ModelRunnerOutput
from accord.core.sched.request import Request
from accord.core.sched.scheduler import Scheduler

BLOCK_SIZE = 4
TURN_TOKENS, ANSWER_TOKENS, TURNS = 10, 5, 5
CHURN_PROMPT = 46
_ids = itertools.count()


def run_alone(sched: Scheduler, prompt: list[int], answer: int, **affinity: str | None) -> tuple[Request, list[int]]:
    """Run one request to its end (the only one in flight); returns it and its output."""
    request = Request(f"r{next(_ids)}", prompt, SamplingParams(max_tokens=answer, ignore_eos=True), **affinity)
    sched.add_request(request)
    rng = random.Random(len(prompt))
    while sched.requests:
        out = sched.schedule()
        samplers = [rid for rid in out.num_scheduled_tokens if sched.requests[rid].num_output_placeholders]
        tokens = [rng.randrange(100, 1000) for _ in samplers]
        sched.update_from_output(out, ModelRunnerOutput(
            req_ids=samplers, sampled_token_ids=tokens, logprobs=[0.0] * len(samplers),
            top_logprobs=[None] * len(samplers)))
    return request, request.output_token_ids


def alternate_sessions(num_blocks: int, with_sessions: bool) -> tuple[list[int], list[int], int]:
    """Sessions "a" and "b" take turns, a one-off request between every two turns.
    Returns per turn the prompt tokens found cached and the ones a cache that kept
    the session's whole history would hold (full blocks of the last turn's computed
    tokens: all but its last sampled one), and the one-off requests' cached tokens."""
    sched = Scheduler(BlockManager(num_blocks, BLOCK_SIZE), max_num_batched_tokens=256, max_num_seqs=4)
    rng = random.Random(0)
    history: dict[str, list[int]] = {"a": [], "b": []}
    cached, expected, churn_cached = [], [], 0
    for _turn, session in itertools.product(range(TURNS), ("a", "b")):
        prompt = history[session] + [rng.randrange(1000, 2000) for _ in range(TURN_TOKENS)]
        computed_before = max(0, len(history[session]) - 1)
        request, output = run_alone(sched, prompt, ANSWER_TOKENS, session_id=session if with_sessions else None)
        cached.append(request.num_cached_tokens)
        expected.append(min(computed_before, len(prompt) - 1) // BLOCK_SIZE * BLOCK_SIZE)
        history[session] = prompt + output
        one_off, _ = run_alone(sched, [rng.randrange(2000, 3000) for _ in range(CHURN_PROMPT)], ANSWER_TOKENS)
        churn_cached += one_off.num_cached_tokens
    return cached, expected, churn_cached


def blocks_for(tokens: int) -> int:
    return -(-tokens // BLOCK_SIZE)


#: Room for both sessions' last histories and a one-off request, and little more.
FINAL_CONTEXT = TURNS * (TURN_TOKENS + ANSWER_TOKENS)
TIGHT_BLOCKS = 2 * blocks_for(FINAL_CONTEXT) + blocks_for(CHURN_PROMPT + ANSWER_TOKENS) + 1


def test_sessions_prefill_only_the_new_turn_while_one_off_requests_churn() -> None:
    cached, expected, churn_cached = alternate_sessions(TIGHT_BLOCKS, with_sessions=True)
    assert cached == expected  # every turn found its session's whole history cached
    assert sum(expected) > 0 and churn_cached == 0  # the one-off prompts are all distinct


def test_without_session_ids_the_churn_evicts_the_sessions_history() -> None:
    cached, expected, _ = alternate_sessions(TIGHT_BLOCKS, with_sessions=False)
    assert sum(cached) < sum(expected)  # global LRU: the one-off requests took their blocks


def test_session_blocks_are_taken_only_after_the_shared_pool_least_recent_session_first() -> None:
    manager = BlockManager(6, 2)
    for seq, tokens, session in (("a", [1, 2, 3, 4], "a"), ("b", [5, 6, 7, 8], "b"), ("x", [9, 10], None)):
        manager.allocate(seq, len(tokens))
        manager.cache_full_blocks(seq, tokens, len(tokens))
        manager.free(seq, session_id=session)
    assert manager.session_blocks("a") == manager.session_blocks("b") == 2 and manager.num_free_blocks == 6
    # Six new blocks: the shared pool's two, then session a's (least recently used), then b's.
    taken = []
    for count in range(1, 7):
        manager.allocate("new", 2 * count)
        taken.append((manager.session_blocks("a"), manager.session_blocks("b")))
    assert taken == [(2, 2), (2, 2), (1, 2), (0, 2), (0, 1), (0, 0)]


def test_a_sessions_cached_blocks_are_revived_by_its_next_turn() -> None:
    manager = BlockManager(8, 2)
    manager.allocate("turn1", 4)
    manager.cache_full_blocks("turn1", [1, 2, 3, 4], 4)
    manager.free("turn1", session_id="s")
    hits = manager.find_cached_prefix([1, 2, 3, 4, 5], 4)
    assert len(hits) == 2 and manager.allocate("turn2", 5, hits)
    assert manager.session_blocks("s") == 0 and manager.num_used_blocks == 3


def test_cache_salt_keeps_differently_salted_requests_from_sharing_blocks() -> None:
    sched = Scheduler(BlockManager(64, BLOCK_SIZE), max_num_batched_tokens=256, max_num_seqs=4)
    prompt = list(range(10, 30))
    run_alone(sched, prompt, 2, cache_salt="tenant-1")
    other_salt, _ = run_alone(sched, prompt, 2, cache_salt="tenant-2")
    unsalted, _ = run_alone(sched, prompt, 2)
    same_salt, _ = run_alone(sched, prompt, 2, cache_salt="tenant-1")
    assert other_salt.num_cached_tokens == 0 and same_salt.num_cached_tokens == 16
    assert unsalted.num_cached_tokens == 0  # the salted chains left no unsalted block


@pytest.mark.parametrize("prompt", [{"prompt_token_ids": [1], "cache_salt": ""}, {"prompt_token_ids": [1], "session_id": 3}])
def test_an_affinity_hint_that_is_not_a_non_empty_string_is_refused(prompt: dict) -> None:
    with pytest.raises(ValueError, match="must be a non-empty string"):
        CacheAffinity.of(prompt)
