"""`accord bench serve` against a scripted stub (a session whose stream moves a fake
clock): TTFT, TPOT, ITL, E2EL, their percentiles, throughput and goodput equal
what the test computes from the script on its own (statistics.quantiles, not numpy);
usage beats chunk counting; a chat stream's role chunk is no token; a failed request
counts as failed and adds nothing."""

from __future__ import annotations

import asyncio
import statistics
from collections import Counter

import pytest
from stub_server import FakeClock, ScriptedRequest, ScriptedServer

from accord.bench.serve.request_types import RequestSettings
from accord.bench.serve.datasets import SampleRequest
from accord.bench.serve.metrics import compute_metrics, detailed_lists
from accord.bench.serve.runner import RungSpec, run_rung

#: Six answers: TTFT, the gaps before each later chunk, and the usage the server reports.
#: Request 4's usage counts 9 tokens over 5 chunks (the server bundled some).
SCRIPT = [
    ScriptedRequest(0.100, (0.020, 0.030, 0.025), usage_completion_tokens=4, usage_prompt_tokens=11),
    ScriptedRequest(0.400, (0.010, 0.010), usage_completion_tokens=3, usage_prompt_tokens=12),
    ScriptedRequest(0.050, (0.090, 0.080, 0.070, 0.060), usage_completion_tokens=5, usage_prompt_tokens=13),
    ScriptedRequest(0.250, (), usage_completion_tokens=1, usage_prompt_tokens=14),
    ScriptedRequest(0.200, (0.040, 0.050, 0.045, 0.055), usage_completion_tokens=9, usage_prompt_tokens=15),
    ScriptedRequest(1.500, (0.005,), usage_completion_tokens=2, usage_prompt_tokens=16),
]
PERCENTILES = [50, 90, 99]
SLOS = {"ttft": 300.0, "tpot": 60.0}


def percentile(values: list[float], p: float) -> float:
    """The p-th percentile, linear between samples (statistics' inclusive method)."""
    if len(values) == 1:
        return values[0]
    return statistics.quantiles(values, n=1000, method="inclusive")[round(p * 10) - 1]


def run(script, backend="openai", prompts=None, clock=None, **settings):
    clock = clock or FakeClock()
    server = ScriptedServer(list(script), clock)
    requests = prompts or [SampleRequest([i, 7, 7], 3, 8) for i in range(len(script))]
    spec = RungSpec(float("inf"), max_concurrency=1, progress=False)

    async def go():
        rung = RequestSettings(backend, "http://stub/v1/x", "stub-model", **settings)
        return await run_rung(server, rung, requests, [], spec, "http://stub", clock=clock)

    return asyncio.run(go()), server


def test_the_figures_equal_the_script():
    rung, _ = run(SCRIPT)
    figures = compute_metrics(rung.outcomes, rung.duration_s, ["ttft", "tpot", "itl", "e2el"], PERCENTILES, SLOS)
    ttft = [r.ttft for r in SCRIPT]
    e2el = [r.ttft + sum(r.gaps) for r in SCRIPT]
    tokens = [r.usage_completion_tokens for r in SCRIPT]
    # TPOT over the server's token count; a one-token answer has none.
    tpot = [(e - t) / (n - 1) for e, t, n in zip(e2el, ttft, tokens) if n > 1]
    itl = [gap for r in SCRIPT for gap in r.gaps]
    # One at a time (max concurrency 1, all sent at once): the run lasts the sum of the answers.
    duration = sum(e2el)
    assert rung.duration_s == pytest.approx(duration)
    assert figures["completed"] == 6 and figures["failed"] == 0
    assert figures["total_input_tokens"] == 11 + 12 + 13 + 14 + 15 + 16
    assert figures["total_output_tokens"] == sum(tokens) == 24
    assert figures["request_throughput"] == pytest.approx(6 / duration)
    assert figures["output_throughput"] == pytest.approx(24 / duration)
    assert figures["total_token_throughput"] == pytest.approx((81 + 24) / duration)
    for name, values in (("ttft", ttft), ("tpot", tpot), ("itl", itl), ("e2el", e2el)):
        assert figures[f"mean_{name}_ms"] == pytest.approx(1000 * statistics.fmean(values)), name
        assert figures[f"median_{name}_ms"] == pytest.approx(1000 * statistics.median(values)), name
        assert figures[f"std_{name}_ms"] == pytest.approx(1000 * statistics.pstdev(values)), name
        for p in PERCENTILES:
            assert figures[f"p{p}_{name}_ms"] == pytest.approx(1000 * percentile(values, p)), (name, p)
    # Good: TTFT <= 300 ms and TPOT <= 60 ms, both. Request 1 misses TTFT, request 2 TPOT
    # (75 ms), request 5 TTFT; request 3 has one token (TPOT 0).
    good = [
        t * 1000 <= SLOS["ttft"] and ((e - t) / (n - 1) if n > 1 else 0.0) * 1000 <= SLOS["tpot"]
        for t, e, n in zip(ttft, e2el, tokens)
    ]
    assert good == [True, False, False, True, True, False]
    assert figures["good_requests"] == 3
    assert figures["request_goodput"] == pytest.approx(3 / duration)
    assert figures["max_concurrent_requests"] == 1
    # Token arrivals by whole second since the first send.
    arrivals, start = Counter(), 0.0
    for r in SCRIPT:
        at = start
        for wait in (r.ttft, *r.gaps):
            at += wait
            arrivals[int(at)] += 1
        start += r.ttft + sum(r.gaps)
    assert figures["max_output_tokens_per_s"] == max(arrivals.values())


def test_without_slos_goodput_is_none_as_in_vllm():
    rung, _ = run(SCRIPT[:2])
    figures = compute_metrics(rung.outcomes, rung.duration_s, ["ttft"], [99], {})
    assert figures["request_goodput"] is None and figures["good_requests"] is None
    assert "mean_tpot_ms" not in figures  # only the selected metrics


def test_without_usage_the_tokenizer_counts_the_text_and_the_prompt_is_as_sent():
    script = [ScriptedRequest(0.1, (0.02, 0.02)), ScriptedRequest(0.2, (0.04,))]
    prompts = [SampleRequest([0], 5, 8), SampleRequest([1], 7, 8)]
    rung, _ = run(script, prompts=prompts)
    words = compute_metrics(rung.outcomes, rung.duration_s, ["tpot"], [50], {}, count_tokens=lambda t: len(t.split()))
    assert words["total_output_tokens"] == 3 + 2 and words["total_input_tokens"] == 5 + 7
    doubled = compute_metrics(rung.outcomes, rung.duration_s, ["tpot"], [50], {}, count_tokens=lambda t: 2 * len(t.split()))
    # Six tokens after 0.1 s over 0.04 s: TPOT 8 ms; four after 0.2 s over 0.04 s: 13.3 ms.
    assert doubled["mean_tpot_ms"] == pytest.approx(1000 * (0.04 / 5 + 0.04 / 3) / 2)
    assert doubled["total_output_tokens"] == 10


def test_a_chat_streams_role_chunk_is_no_token_and_the_body_is_a_chat_request():
    script = [ScriptedRequest(0.3, (0.05, 0.05), usage_completion_tokens=3)]
    rung, server = run(script, backend="openai-chat", prompts=[SampleRequest("0", 1, 3)], ignore_eos=True)
    (outcome,) = rung.outcomes
    assert outcome.success and outcome.ttft == pytest.approx(0.3) and outcome.itl == pytest.approx([0.05, 0.05])
    assert outcome.generated_text == "w0 w1 w2 "
    (body,) = server.bodies
    assert body["messages"] == [{"role": "user", "content": "0"}] and body["max_completion_tokens"] == 3
    assert body["stream"] is True and body["stream_options"] == {"include_usage": True} and body["ignore_eos"] is True


def test_a_completions_body_carries_the_prompt_ids_length_and_extra_fields():
    _, server = run(SCRIPT[:1], extra_body={"temperature": 0.0})
    (body,) = server.bodies
    assert body == {
        "prompt": [0, 7, 7], "max_tokens": 8, "model": "stub-model", "stream": True,
        "stream_options": {"include_usage": True}, "temperature": 0.0,
    }  # fmt: skip


def test_a_failed_request_counts_as_failed_and_adds_no_tokens():
    script = [SCRIPT[0], ScriptedRequest(0.0, (), status=500), SCRIPT[2]]
    rung, _ = run(script)
    figures = compute_metrics(rung.outcomes, rung.duration_s, ["ttft"], [50], {"ttft": 1000.0})
    assert figures["completed"] == 2 and figures["failed"] == 1
    assert figures["total_output_tokens"] == 4 + 5 and figures["good_requests"] == 2
    assert figures["median_ttft_ms"] == pytest.approx(1000 * statistics.median([0.1, 0.05]))
    details = detailed_lists(rung.outcomes, None)
    assert details["output_lens"] == [4, 0, 5]
    assert details["errors"][1].startswith("HTTP 500") and details["errors"][0] == ""
