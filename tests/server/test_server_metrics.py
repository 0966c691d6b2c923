"""`/metrics` is valid Prometheus text with vLLM's metric set under vLLM's names
(vllm/v1/metrics/loggers.py in vLLM 0.33), labels and buckets, and its counters follow
the requests made."""

from __future__ import annotations

import time

import httpx
import openai
from prometheus_client.parser import text_string_to_metric_families
from server_harness import scrape_metrics

EXPECTED_FAMILIES = {
    "vllm:time_to_first_token_seconds", "vllm:inter_token_latency_seconds",
    "vllm:request_time_per_output_token_seconds", "vllm:e2e_request_latency_seconds",
    "vllm:num_requests_running", "vllm:num_requests_waiting", "vllm:kv_cache_usage_perc",
    "vllm:prefix_cache_queries", "vllm:prefix_cache_hits", "vllm:num_preemptions", "vllm:prompt_tokens",
    "vllm:generation_tokens", "vllm:request_success", "accord:request_failure", "vllm:admission_rejections",
    "vllm:request_queue_time_seconds", "vllm:request_prompt_tokens", "vllm:request_generation_tokens",
    "vllm:iteration_tokens_total",
}


def test_metrics_parse_and_include_the_vllm_metric_set(http: httpx.Client) -> None:
    families = {family.name for family in text_string_to_metric_families(http.get("/metrics").text)}
    assert EXPECTED_FAMILIES <= families


def test_families_carry_vllms_labels_and_buckets(http: httpx.Client, client: openai.OpenAI) -> None:
    client.completions.create(model="accord-demo-random", prompt="one", max_tokens=2)  # histograms show once observed
    families = {family.name: family for family in text_string_to_metric_families(http.get("/metrics").text)}
    running = families["vllm:num_requests_running"].samples[0]
    assert running.labels == {"model_name": "accord-demo-random", "engine": "0"}

    def bounds(name: str) -> list[float]:
        return [float(s.labels["le"]) for s in families[name].samples if s.name.endswith("_bucket")]

    # vLLM 0.33's vllm/v1/metrics/buckets.py: TIME_TO_FIRST_TOKEN_BUCKETS, REQUEST_LATENCY_BUCKETS,
    # INTER_TOKEN_LATENCY_BUCKETS, and the 1-2-5 series up to max_model_len (256 here).
    assert bounds("vllm:time_to_first_token_seconds") == [
        0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0, 20.0, 40.0, 80.0,
        160.0, 640.0, 2560.0, float("inf")]
    assert bounds("vllm:e2e_request_latency_seconds") == [
        0.3, 0.5, 0.8, 1.0, 1.5, 2.0, 2.5, 5.0, 10.0, 15.0, 20.0, 30.0, 40.0, 50.0, 60.0, 120.0, 240.0, 480.0, 960.0,
        1920.0, 7680.0, float("inf")]
    assert bounds("vllm:inter_token_latency_seconds")[:4] == [0.01, 0.025, 0.05, 0.075]
    assert bounds("vllm:request_prompt_tokens") == [1, 2, 5, 10, 20, 50, 100, 200, float("inf")]
    assert bounds("vllm:iteration_tokens_total") == [
        1, 8, 16, 32, 64, 128, 256, 512, 1024, 2048, 4096, 8192, 16384, float("inf")]
    assert not [name for name in families if name.startswith("accord:") and name not in (
        "accord:request_failure", "accord:num_prompts_tokenizing", "accord:tenant_reasoning_tokens",
        "accord:preemptions", "accord:request_queue_time_by_lane_seconds")]


def test_counters_match_the_requests_made(http: httpx.Client, client: openai.OpenAI) -> None:
    before = scrape_metrics(http)
    completions = [
        client.completions.create(model="accord-demo-random", prompt=prompt, max_tokens=3, extra_body={"ignore_eos": True})
        for prompt in ("one", "two words", "three more words")
    ]
    after = scrape_metrics(http)

    def delta(name: str) -> float:
        return after.get(name, 0.0) - before.get(name, 0.0)

    assert delta("vllm:request_success_total[finished_reason=length]") == 3
    assert delta("vllm:prompt_tokens_total") == sum(c.usage.prompt_tokens for c in completions)
    assert delta("vllm:generation_tokens_total") == 9
    assert delta("vllm:e2e_request_latency_seconds_count") == 3
    assert delta("vllm:time_to_first_token_seconds_count") == 3
    # vLLM's per-interval histogram: one observation per step after the first token.
    assert delta("vllm:inter_token_latency_seconds_count") == 3 * (3 - 1)
    assert delta("vllm:request_time_per_output_token_seconds_count") == 3
    assert delta("vllm:request_queue_time_seconds_count") == 3
    assert delta("vllm:request_prompt_tokens_count") == 3
    assert delta("vllm:request_prompt_tokens_sum") == sum(c.usage.prompt_tokens for c in completions)
    assert delta("vllm:request_generation_tokens_sum") == 9
    # Every step's tokens land in the iteration histogram: 9 sampled + the prompts.
    assert delta("vllm:iteration_tokens_total_count") >= 3
    assert delta("vllm:iteration_tokens_total_sum") >= 9


def test_an_aborted_request_is_counted_as_vllm_does(http: httpx.Client) -> None:
    before = scrape_metrics(http)
    body = {"prompt": "A long story:", "max_tokens": 200, "ignore_eos": True, "stream": True}
    with http.stream("POST", "/v1/completions", json=body) as response:
        assert next(response.iter_lines()).startswith("data: ")
    deadline = time.monotonic() + 10
    key = "vllm:request_success_total[finished_reason=abort]"
    while scrape_metrics(http).get(key, 0) == before.get(key, 0) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert scrape_metrics(http)[key] - before.get(key, 0) == 1
