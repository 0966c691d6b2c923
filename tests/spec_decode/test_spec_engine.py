"""Speculative decoding through `LLM`, on the counting model (tests/spec_decode/conftest.py):
greedy outputs equal those without speculation for ngram and suffix proposals (adaptive
or not), under chunked prefill, prefix-cache hits, forced preemption, stop strings,
max_tokens, n = 2 and logprobs; grammar-constrained requests take no drafts; seeded
sampling reproduces; and every test ends with every KV block back in the pool (the
conftest's check)."""

from __future__ import annotations

import pytest

from accord.core.sampling_params import SamplingParams
from accord.core.spec_decode.adaptive import REFRESH_STEPS
from accord.core.structured_output.params import StructuredOutputsParams
from spec_decode_models import drafts_never_pay

#: Each test generates through a model (seconds on a 2-core host): the slow tier.
pytestmark = pytest.mark.slow

METHODS = {
    "ngram": {"method": "ngram", "num_speculative_tokens": 3, "prompt_lookup_min": 1, "prompt_lookup_max": 3},
    "suffix": {"method": "suffix", "num_speculative_tokens": 4},
}
#: Counting runs the model continues, each quoted again at its end so drafts have a source.
PROMPTS = [list(range(100 + 7 * i, 130 + 7 * i)) + list(range(100 + 7 * i, 106 + 7 * i)) for i in range(4)]
ENGINE = {"max_model_len": 256, "num_gpu_blocks_override": 64}
GREEDY = SamplingParams(max_tokens=40, temperature=0.0)


def generate(llm, params: SamplingParams = GREEDY, prompts: list[list[int]] = PROMPTS):
    return llm.generate([{"prompt_token_ids": p} for p in prompts], params, use_tqdm=False)


def token_ids(outputs) -> list[list[list[int]]]:
    return [[sample.token_ids for sample in output.outputs] for output in outputs]


@pytest.fixture(scope="module")
def baseline(counting_llama_dir, make_llm):
    return make_llm(counting_llama_dir, **ENGINE)


@pytest.mark.parametrize("method", METHODS)
def test_greedy_outputs_equal_those_without_speculation(counting_llama_dir, make_llm, baseline, method):
    llm = make_llm(counting_llama_dir, speculative_config=METHODS[method], **ENGINE)
    before = llm.llm_engine.stats.spec_decode_num_accepted_tokens_per_pos[1:2] or [0]
    outputs = generate(llm)
    assert token_ids(outputs) == token_ids(generate(baseline))
    stats = llm.llm_engine.stats
    # The check ran, accepted drafts, and accepted two in one step at least once.
    assert stats.spec_decode_num_accepted_tokens > 0 and stats.spec_decode_num_accepted_tokens_per_pos[1] > before[0]
    assert any(output.metrics.acceptance_rate for output in outputs)


@pytest.mark.parametrize("method", METHODS)
def test_greedy_outputs_equal_with_adaptive_speculation(counting_llama_dir, make_llm, baseline, method):
    # Whatever the measured step times make it check, greedy output is unchanged; each
    # batch size's second decode step checks every proposal (adaptive.py), so drafts ran.
    spec = {**METHODS[method], "adaptive_num_speculative_tokens": True}
    llm = make_llm(counting_llama_dir, speculative_config=spec, **ENGINE)
    outputs = generate(llm)
    assert token_ids(outputs) == token_ids(generate(baseline))
    stats = llm.llm_engine.stats
    assert 0 < stats.spec_decode_num_accepted_tokens <= stats.spec_decode_num_draft_tokens


def test_adaptive_speculation_stops_proposing_where_drafts_do_not_pay(
    counting_llama_dir, make_llm, baseline, monkeypatch
):
    spec = {"method": "suffix", "num_speculative_tokens": 2, "adaptive_num_speculative_tokens": True}
    llm = make_llm(counting_llama_dir, speculative_config=spec, **ENGINE)
    proposed = drafts_never_pay(llm.llm_engine.scheduler, monkeypatch)
    assert token_ids(generate(llm)) == token_ids(generate(baseline))
    # Proposals come only for the measurements: the first decode steps and one step in REFRESH_STEPS.
    assert len(proposed) > 30 and sum(proposed) <= 3 + len(proposed) // REFRESH_STEPS


@pytest.mark.parametrize("method", METHODS)
def test_greedy_outputs_equal_under_chunked_prefill(counting_llama_dir, make_llm, baseline, method):
    # 16 tokens a step: every prompt is chunked, and drafts compete for the budget.
    llm = make_llm(counting_llama_dir, speculative_config=METHODS[method], max_num_batched_tokens=16, **ENGINE)
    assert token_ids(generate(llm)) == token_ids(generate(baseline))


def test_greedy_outputs_equal_under_async_scheduling(counting_llama_dir, make_llm, baseline):
    # Speculating steps run one at a time: the next drafts follow from the last tokens.
    llm = make_llm(counting_llama_dir, speculative_config=METHODS["ngram"], async_scheduling=True, **ENGINE)
    assert token_ids(generate(llm)) == token_ids(generate(baseline))
    assert llm.llm_engine.stats.spec_decode_num_accepted_tokens > 0


def test_greedy_outputs_equal_under_forced_preemption(counting_llama_dir, make_llm, baseline):
    # 16 blocks of 16 tokens for four requests of ~76 tokens: some are preempted.
    llm = make_llm(counting_llama_dir, speculative_config=METHODS["ngram"], max_model_len=256,
                   num_gpu_blocks_override=16)
    params = SamplingParams(max_tokens=40, temperature=0.0)
    assert token_ids(generate(llm, params)) == token_ids(generate(baseline, params))
    assert llm.llm_engine.stats.num_preemptions > 0


def test_greedy_outputs_equal_with_prefix_cache_hits(counting_llama_dir, make_llm, baseline):
    llm = make_llm(counting_llama_dir, speculative_config=METHODS["suffix"], **ENGINE)
    first = generate(llm)
    again = generate(llm)  # the prompts' blocks, and accepted drafts' blocks, are cached now
    assert all(output.num_cached_tokens > 0 for output in again)
    assert token_ids(first) == token_ids(again) == token_ids(generate(baseline))


@pytest.mark.parametrize("max_tokens", [1, 2, 3, 5, 8])
def test_no_token_past_max_tokens(counting_llama_dir, make_llm, baseline, max_tokens):
    llm = make_llm(counting_llama_dir, speculative_config=METHODS["suffix"], **ENGINE)
    params = SamplingParams(max_tokens=max_tokens, temperature=0.0)
    outputs = generate(llm, params)
    assert token_ids(outputs) == token_ids(generate(baseline, params))
    assert all(len(o.outputs[0].token_ids) == max_tokens and o.outputs[0].finish_reason == "length" for o in outputs)


def test_no_token_past_a_stop_string(counting_llama_dir, make_llm, baseline):
    llm = make_llm(counting_llama_dir, speculative_config=METHODS["ngram"], **ENGINE)
    # A stop string the greedy text reaches well after its start: from the baseline's own text.
    text = generate(baseline, SamplingParams(max_tokens=40, temperature=0.0))[0].outputs[0].text
    stop = text[len(text) // 2 : len(text) // 2 + 3]
    params = SamplingParams(max_tokens=40, temperature=0.0, stop=[stop])
    expected, got = generate(baseline, params), generate(llm, params)
    assert expected[0].outputs[0].finish_reason == "stop"
    assert [[(s.token_ids, s.text, s.finish_reason) for s in o.outputs] for o in got] == [
        [(s.token_ids, s.text, s.finish_reason) for s in o.outputs] for o in expected
    ]


def test_logprobs_of_the_emitted_tokens_equal_those_without_speculation(counting_llama_dir, make_llm, baseline):
    llm = make_llm(counting_llama_dir, speculative_config=METHODS["ngram"], **ENGINE)
    params = SamplingParams(max_tokens=20, temperature=0.0, logprobs=2)
    got, expected = generate(llm, params), generate(baseline, params)
    assert token_ids(got) == token_ids(expected)
    for mine, theirs in zip(got, expected):
        for position, (a, b) in enumerate(zip(mine.outputs[0].logprobs, theirs.outputs[0].logprobs)):
            assert a.keys() == b.keys(), position
            for token in a:
                assert a[token].rank == b[token].rank
                assert a[token].logprob == pytest.approx(b[token].logprob, abs=1e-4)


def test_two_greedy_samples_each_equal_the_output_without_speculation(counting_llama_dir, make_llm, baseline):
    llm = make_llm(counting_llama_dir, speculative_config=METHODS["suffix"], **ENGINE)
    params = SamplingParams(max_tokens=30, temperature=0.0, n=2)
    got = token_ids(generate(llm, params))
    assert got == token_ids(generate(baseline, params)) and all(a == b for a, b in got)


def test_seeded_sampling_with_speculation_reproduces_alone_and_batched(counting_llama_dir, make_llm):
    llm = make_llm(counting_llama_dir, speculative_config=METHODS["ngram"], **ENGINE)
    params = SamplingParams(max_tokens=30, temperature=0.8, top_p=0.9, seed=11, n=2)
    alone = token_ids(generate(llm, params, PROMPTS[:1]))
    batched = token_ids(generate(llm, params, PROMPTS))
    assert alone[0] == batched[0] and alone == token_ids(generate(llm, params, PROMPTS[:1]))
    assert alone[0][0] != alone[0][1]  # the siblings' seeds differ


def test_a_grammar_constrained_request_takes_no_drafts(counting_llama_dir, make_llm, baseline):
    llm = make_llm(counting_llama_dir, speculative_config=METHODS["ngram"], **ENGINE)
    params = SamplingParams(max_tokens=12, temperature=0.0,
                            structured_outputs=StructuredOutputsParams(regex="[a-z ]{1,12}"))
    drafted = llm.llm_engine.stats.spec_decode_num_draft_tokens
    got = generate(llm, params, PROMPTS[:2])
    assert token_ids(got) == token_ids(generate(baseline, params, PROMPTS[:2]))
    assert llm.llm_engine.stats.spec_decode_num_draft_tokens == drafted
