"""Speculative decoding with a draft model through `LLM`: a one-layer counting Llama
drafts for the two-layer one (tests/spec_decode/conftest.py, both written by
transformers, same vocabulary). Greedy outputs equal those without speculation, plainly,
under chunked prefill, with prefix-cache hits and under forced preemption; drafts are
both accepted and rejected; seeded sampling (n = 2) reproduces alone and batched; a
draft of another vocabulary is refused at start; adaptive speculation stops the draft
model drafting where drafts do not pay; and every test ends with every KV
block back in the pool (the conftest's check). The sampled distribution with a draft
model is checked in test_spec_sampling_distribution.py."""

from __future__ import annotations

import pytest

from accord.core.sampling_params import SamplingParams
from spec_decode_models import drafts_never_pay, write_counting_llama

#: Each test generates through a model (seconds on a 2-core host): the slow tier.
pytestmark = pytest.mark.slow

#: Counting runs the models continue (no copy of the output in the prompt: the drafts are the draft model's).
PROMPTS = [list(range(100 + 7 * i, 130 + 7 * i)) for i in range(4)]
ENGINE = {"max_model_len": 256, "num_gpu_blocks_override": 64}
GREEDY = SamplingParams(max_tokens=40, temperature=0.0)


def spec(draft_dir) -> dict:
    return {"method": "draft_model", "model": str(draft_dir), "num_speculative_tokens": 3}


def generate(llm, params: SamplingParams = GREEDY):
    return llm.generate([{"prompt_token_ids": p} for p in PROMPTS], params, use_tqdm=False)


def token_ids(outputs) -> list[list[int]]:
    return [output.outputs[0].token_ids for output in outputs]


@pytest.fixture(scope="module")
def baseline_tokens(counting_llama_dir, make_llm) -> list[list[int]]:
    return token_ids(generate(make_llm(counting_llama_dir, **ENGINE)))


def test_greedy_outputs_equal_those_without_speculation(counting_llama_dir, counting_draft_dir, make_llm,
                                                        baseline_tokens):
    llm = make_llm(counting_llama_dir, speculative_config=spec(counting_draft_dir), **ENGINE)
    stats = llm.llm_engine.stats
    accepted, drafted = stats.spec_decode_num_accepted_tokens, stats.spec_decode_num_draft_tokens
    assert token_ids(generate(llm)) == baseline_tokens
    accepted, drafted = stats.spec_decode_num_accepted_tokens - accepted, stats.spec_decode_num_draft_tokens - drafted
    # The draft model drafted, the check accepted some drafts and rejected others.
    assert 0 < accepted < drafted


def test_greedy_outputs_equal_under_chunked_prefill(counting_llama_dir, counting_draft_dir, make_llm,
                                                    baseline_tokens):
    # 16 tokens a step: every prompt is chunked (the draft's KV of each chunk too).
    llm = make_llm(counting_llama_dir, speculative_config=spec(counting_draft_dir), max_num_batched_tokens=16,
                   **ENGINE)
    assert token_ids(generate(llm)) == baseline_tokens
    assert llm.llm_engine.stats.spec_decode_num_accepted_tokens > 0


def test_greedy_outputs_equal_with_prefix_cache_hits(counting_llama_dir, counting_draft_dir, make_llm,
                                                     baseline_tokens):
    llm = make_llm(counting_llama_dir, speculative_config=spec(counting_draft_dir), enable_prefix_caching=True,
                   **ENGINE)
    first = generate(llm)
    stats = llm.llm_engine.stats
    accepted, drafted = stats.spec_decode_num_accepted_tokens, stats.spec_decode_num_draft_tokens
    again = generate(llm)  # the prompts' blocks are cached now: the draft reads its KV from them too
    assert all(output.num_cached_tokens > 0 for output in again)
    assert token_ids(first) == token_ids(again) == baseline_tokens
    # As many drafts accepted as the first time: the cached blocks hold the draft's KV as well.
    assert stats.spec_decode_num_accepted_tokens - accepted == accepted
    assert stats.spec_decode_num_draft_tokens - drafted == drafted


def test_a_draft_of_another_vocabulary_is_refused_naming_both_sizes(counting_llama_dir, tmp_path):
    from accord import LLM
    from accord.core.model_loader.load import read_model_config

    draft = write_counting_llama(tmp_path / "wide_draft", num_layers=1, seed=1, extra_vocab=8)
    target_size = read_model_config(counting_llama_dir).vocab_size
    with pytest.raises(ValueError, match=f"vocabulary of {target_size + 8} tokens.* one of {target_size}"):
        LLM(model=str(counting_llama_dir), backend="cpu", speculative_config=spec(draft), **ENGINE)


def test_greedy_outputs_equal_under_forced_preemption(counting_llama_dir, counting_draft_dir, make_llm,
                                                      baseline_tokens):
    # 16 blocks of 16 tokens for four requests of ~70 tokens (and the drafts' lookahead): some are preempted.
    llm = make_llm(counting_llama_dir, speculative_config=spec(counting_draft_dir), max_model_len=256,
                   num_gpu_blocks_override=16)
    assert token_ids(generate(llm)) == baseline_tokens
    assert llm.llm_engine.stats.num_preemptions > 0


def test_seeded_sampling_with_a_draft_model_reproduces_alone_and_batched(counting_llama_dir, counting_draft_dir,
                                                                          make_llm):
    llm = make_llm(counting_llama_dir, speculative_config=spec(counting_draft_dir), **ENGINE)
    params = SamplingParams(max_tokens=30, temperature=0.8, top_p=0.9, seed=11, n=2)

    def outputs(prompts: list[list[int]]) -> list[list[list[int]]]:
        results = llm.generate([{"prompt_token_ids": p} for p in prompts], params, use_tqdm=False)
        return [[sample.token_ids for sample in result.outputs] for result in results]

    alone, batched = outputs(PROMPTS[:1]), outputs(PROMPTS)
    assert alone[0] == batched[0] and alone == outputs(PROMPTS[:1])
    assert alone[0][0] != alone[0][1]  # the siblings' seeds differ


def test_adaptive_speculation_stops_drafting_where_drafts_do_not_pay(counting_llama_dir, counting_draft_dir,
                                                                     make_llm, baseline_tokens, monkeypatch):
    from accord.core.spec_decode.adaptive import REFRESH_STEPS

    llm = make_llm(counting_llama_dir, speculative_config={**spec(counting_draft_dir),
                                                           "adaptive_num_speculative_tokens": True}, **ENGINE)
    drafted = drafts_never_pay(llm.llm_engine.scheduler, monkeypatch)
    assert token_ids(generate(llm)) == baseline_tokens
    # The draft model drafts only for the measurements: the first decode steps, then at
    # most two steps in REFRESH_STEPS (the plain step and the probe measured again).
    assert len(drafted) > 30 and sum(drafted) <= 3 + 2 * (len(drafted) // REFRESH_STEPS)
