"""The in-process parts of data parallelism: the balancer's choice of replica, the
outstanding-token load it compares, replicas' stats combined into one engine's, and the
dummy batch an idle replica runs (which must leave every KV cache untouched)."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from test_engine_scheduler import make_scheduler, make_seq, run_step

from accord import SamplingParams
from accord.core.sched.dp_balancer import DataParallelBalancer
from accord.core.stats import ITERATION_TOKEN_BUCKETS, EngineStats

BLOCK = 4


def balancer(slack: int = 10, capacity: int = 16) -> DataParallelBalancer:
    return DataParallelBalancer(block_size=BLOCK, affinity_slack=slack, capacity=capacity)


def test_a_request_goes_to_the_replica_with_the_fewest_outstanding_tokens() -> None:
    assert balancer().choose([1, 2], [100, 30, 50]) == 1


def test_equal_loads_go_to_the_lowest_replica() -> None:
    assert balancer().choose([1, 2], [7, 7]) == 0


def test_a_shared_first_block_follows_its_replica_while_it_is_within_the_slack() -> None:
    chooser = balancer(slack=10)
    assert chooser.choose([5, 6, 7, 8, 1], [0, 0]) == 0
    assert chooser.choose([5, 6, 7, 8, 2, 2], [10, 0]) == 0, "the prefix's replica, 10 tokens busier"
    assert chooser.choose([5, 6, 7, 8, 3], [11, 0]) == 1, "past the slack: the lightest replica"
    assert chooser.choose([5, 6, 7, 8, 4], [11, 11]) == 1, "the prefix moved with the last choice"


def test_a_prompt_shorter_than_a_block_has_no_affinity() -> None:
    chooser = balancer()
    assert chooser.choose([5, 6, 7], [0, 1]) == 0
    assert chooser.choose([5, 6, 7], [1, 0]) == 1


def test_the_prefix_memory_forgets_the_least_recent_first_block_past_its_capacity() -> None:
    chooser = balancer(slack=100, capacity=1)
    assert chooser.choose([1, 1, 1, 1], [0, 5]) == 0
    assert chooser.choose([2, 2, 2, 2], [5, 0]) == 1
    assert chooser.choose([1, 1, 1, 1], [5, 0]) == 1, "the first prefix was forgotten"


def test_outstanding_tokens_count_uncomputed_prompt_and_allowed_output() -> None:
    scheduler = make_scheduler(budget=8)
    short, long = make_seq(6), make_seq(20)
    short.params = SamplingParams(max_tokens=3)
    long.params = SamplingParams(max_tokens=5)
    scheduler.add_request(short)
    scheduler.add_request(long)
    assert scheduler.outstanding_tokens == (6 + 3) + (20 + 5)
    run_step(scheduler)  # short's prompt (6) and 2 of long's, short samples one token
    assert scheduler.outstanding_tokens == (9 - 6) + (25 - 2)


def test_combined_stats_sum_every_gauge_counter_and_bucket() -> None:
    first = EngineStats(num_running=1, kv_blocks_used=2, kv_blocks_total=10, generation_tokens=5)
    second = EngineStats(num_running=3, kv_blocks_used=6, kv_blocks_total=10, generation_tokens=7)
    first.observe_iteration(3)
    second.observe_iteration(3)
    second.observe_iteration(5000)
    total = EngineStats.combined([first, second])
    assert (total.num_running, total.generation_tokens, total.kv_cache_usage) == (4, 12, 0.4)
    assert total.iteration_tokens_sum == 5006
    buckets = [0] * (len(ITERATION_TOKEN_BUCKETS) + 1)
    buckets[1] += 2  # two steps of 3 tokens: the (1, 8] bucket
    buckets[-3] += 1  # 5000 tokens: the (4096, 8192] bucket
    assert total.iteration_tokens_counts == buckets


@pytest.mark.parametrize("architecture", ["llama", "deepseek_v3"])
def test_a_dummy_batch_writes_no_kv_and_the_engine_serves_on(
    architecture: str, make_llm, request: pytest.FixtureRequest
) -> None:
    model_dir: Path = request.getfixturevalue(f"{architecture}_dir")
    llm = make_llm(model_dir, backend="cpu", max_model_len=128, num_gpu_blocks_override=16)
    greedy = SamplingParams(temperature=0.0, max_tokens=4, ignore_eos=True)
    prompt = {"prompt_token_ids": list(range(1, 40))}
    before = llm.generate(prompt, greedy, use_tqdm=False)[0].outputs[0].token_ids
    runner = llm.llm_engine.executor.driver_worker.runner
    # Compared as bytes: host caches are not zeroed, so an unused slot may hold a NaN
    # pattern from reused heap memory, and NaN != NaN would fail an unchanged cache.
    def cache_bytes() -> list[torch.Tensor]:
        return [tensor.view(torch.uint8).clone() for layer in runner.kv_caches for tensor in layer]

    before_dummy = cache_bytes()
    assert any(cache.any() for cache in before_dummy), "the request left KV to protect"
    runner.dummy_run()
    assert all(torch.equal(old, new) for old, new in zip(before_dummy, cache_bytes()))
    assert llm.generate(prompt, greedy, use_tqdm=False)[0].outputs[0].token_ids == before
