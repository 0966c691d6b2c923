"""`/metrics` is valid Prometheus text with vLLM's metric set under `accord:`, and its
counters follow the requests made."""

from __future__ import annotations

import time

import httpx
import openai
from prometheus_client.parser import text_string_to_metric_families
from server_harness import scrape_metrics

EXPECTED_FAMILIES = {
    "accord:time_to_first_token_seconds", "accord:time_per_output_token_seconds", "accord:e2e_request_latency_seconds",
    "accord:num_requests_running", "accord:num_requests_waiting", "accord:kv_cache_usage_perc",
    "accord:prefix_cache_queries", "accord:prefix_cache_hits", "accord:num_preemptions", "accord:prompt_tokens",
    "accord:generation_tokens", "accord:request_success", "accord:request_failure", "accord:request_rejected",
    "accord:request_queue_time_seconds", "accord:request_prompt_tokens", "accord:request_generation_tokens",
    "accord:iteration_tokens_total",
}


def test_metrics_parse_and_include_the_vllm_metric_set(http: httpx.Client) -> None:
    families = {family.name for family in text_string_to_metric_families(http.get("/metrics").text)}
    assert EXPECTED_FAMILIES <= families


def test_counters_match_the_requests_made(http: httpx.Client, client: openai.OpenAI) -> None:
    before = scrape_metrics(http)
    completions = [
        client.completions.create(model="accord-demo-random", prompt=prompt, max_tokens=3, extra_body={"ignore_eos": True})
        for prompt in ("one", "two words", "three more words")
    ]
    after = scrape_metrics(http)

    def delta(name: str) -> float:
        return after.get(name, 0.0) - before.get(name, 0.0)

    assert delta("accord:request_success_total[finished_reason=length]") == 3
    assert delta("accord:prompt_tokens_total") == sum(c.usage.prompt_tokens for c in completions)
    assert delta("accord:generation_tokens_total") == 9
    assert delta("accord:e2e_request_latency_seconds_count") == 3
    assert delta("accord:time_to_first_token_seconds_count") == 3
    # vLLM's per-interval histogram: one observation per step after the first token.
    assert delta("accord:time_per_output_token_seconds_count") == 3 * (3 - 1)
    assert delta("accord:request_queue_time_seconds_count") == 3
    assert delta("accord:request_prompt_tokens_count") == 3
    assert delta("accord:request_prompt_tokens_sum") == sum(c.usage.prompt_tokens for c in completions)
    assert delta("accord:request_generation_tokens_sum") == 9
    # Every step's tokens land in the iteration histogram: 9 sampled + the prompts.
    assert delta("accord:iteration_tokens_total_count") >= 3
    assert delta("accord:iteration_tokens_total_sum") >= 9


def test_an_aborted_request_is_counted_as_vllm_does(http: httpx.Client) -> None:
    before = scrape_metrics(http)
    body = {"prompt": "A long story:", "max_tokens": 200, "ignore_eos": True, "stream": True}
    with http.stream("POST", "/v1/completions", json=body) as response:
        assert next(response.iter_lines()).startswith("data: ")
    deadline = time.monotonic() + 10
    key = "accord:request_success_total[finished_reason=abort]"
    while scrape_metrics(http).get(key, 0) == before.get(key, 0) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert scrape_metrics(http)[key] - before.get(key, 0) == 1
