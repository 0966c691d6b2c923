"""Thinking budgets in the engine, on a tiny random DeepSeek-R1-style model whose
thinking never ends by itself (`</think>` and EOS biased away): the thinking ends at
exactly `thinking_token_budget` tokens with the end marker forced, the answer follows
with its own max_tokens, and the tokens match transformers' greedy decoding with the
marker put in at the budget; a grammar constrains the answer only."""

from __future__ import annotations

import re

import pytest
from reasoning_models import THINK_END, THINK_START, hf_greedy_with_budget

from accord import SamplingParams
from accord.core.structured_output import StructuredOutputsParams
from accord.core.thinking import ThinkingMarkers

BUDGET, ANSWER_TOKENS = 6, 4


@pytest.fixture(scope="module")
def setup(r1_llm):
    tokenizer = r1_llm.get_tokenizer()
    markers = ThinkingMarkers(tokenizer.encode(THINK_START, False)[0], tokenizer.encode(THINK_END, False)[0])
    prompt = tokenizer.apply_chat_template([{"role": "user", "content": "Is 7 prime?"}], tokenize=True)
    # The thinking never ends by itself, nor the output.
    bias = {markers.end_id: -100.0, tokenizer.eos_token_id: -100.0}
    return r1_llm, markers, prompt, bias


def generate(llm, prompt: list[int], **params) -> list[int]:
    output = llm.generate([{"prompt_token_ids": prompt}], SamplingParams(**params), use_tqdm=False)[0]
    return list(output.outputs[0].token_ids)


def test_the_r1_prompt_opens_the_thinking(setup) -> None:
    _, markers, prompt, _ = setup
    assert markers.start_id in prompt[-3:] and markers.thinks_after(prompt)


def test_a_budget_ends_the_thinking_at_exactly_n_tokens_and_the_answer_follows(setup, r1_dir) -> None:
    llm, markers, prompt, bias = setup
    tokens = generate(llm, prompt, temperature=0.0, max_tokens=ANSWER_TOKENS, logit_bias=bias,
                      thinking_markers=markers, thinking_token_budget=BUDGET)
    assert markers.end_id not in tokens[:BUDGET]
    assert tokens[BUDGET] == markers.end_id
    assert len(tokens) == BUDGET + 1 + ANSWER_TOKENS  # max_tokens bounds the answer alone
    assert tokens == hf_greedy_with_budget(r1_dir, prompt, bias, markers.end_id, BUDGET, len(tokens))


def test_a_sampled_request_is_forced_too(setup) -> None:
    llm, markers, prompt, bias = setup
    tokens = generate(llm, prompt, temperature=1.0, seed=3, max_tokens=2, logit_bias=bias,
                      thinking_markers=markers, thinking_token_budget=3)
    assert len(tokens) == 6 and tokens[3] == markers.end_id and markers.end_id not in tokens[:3]


def test_without_a_budget_max_tokens_counts_the_thinking_too(setup) -> None:
    llm, markers, prompt, bias = setup
    tokens = generate(llm, prompt, temperature=0.0, max_tokens=5, logit_bias=bias, thinking_markers=markers)
    assert len(tokens) == 5 and markers.end_id not in tokens


def test_a_budget_of_zero_answers_at_once(setup) -> None:
    llm, markers, prompt, bias = setup
    tokens = generate(llm, prompt, temperature=0.0, max_tokens=2, logit_bias=bias,
                      thinking_markers=markers, thinking_token_budget=0)
    assert tokens[0] == markers.end_id and len(tokens) == 3


def test_a_prompt_that_closed_the_thinking_is_never_forced(setup) -> None:
    llm, markers, prompt, bias = setup
    closed = prompt + [markers.end_id]  # as Qwen3's enable_thinking=False leaves it
    tokens = generate(llm, closed, temperature=0.0, max_tokens=5, logit_bias=bias,
                      thinking_markers=markers, thinking_token_budget=2)
    assert len(tokens) == 5 and markers.end_id not in tokens


@pytest.mark.slow  # compiling the grammar's tokenizer takes ~7 s on 2 cores
def test_a_grammar_constrains_the_answer_and_leaves_the_thinking_free(setup, r1_llm) -> None:
    llm, markers, prompt, bias = setup
    free = generate(llm, prompt, temperature=0.0, max_tokens=BUDGET, logit_bias=bias)
    tokens = generate(llm, prompt, temperature=0.0, max_tokens=8, logit_bias=bias, thinking_markers=markers,
                      thinking_token_budget=BUDGET, structured_outputs=StructuredOutputsParams(regex="(yes|no)"))
    tokenizer = r1_llm.get_tokenizer()
    assert tokens[:BUDGET] == free  # the thinking is what the model writes unconstrained
    assert not re.fullmatch("(yes|no)", tokenizer.decode(free))  # which the grammar would have refused
    assert tokens[BUDGET] == markers.end_id
    assert tokenizer.decode(tokens[BUDGET + 1:]) in ("yes", "no")


def test_a_budget_needs_thinking_markers() -> None:
    with pytest.raises(ValueError, match="thinking_token_budget needs a reasoning model's thinking markers"):
        SamplingParams(thinking_token_budget=4)
