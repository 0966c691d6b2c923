"""The official `openai` client against `accord serve`: completions and chat, streamed
and not, agree with the offline LLM API and report honest token counts."""

from __future__ import annotations

from typing import Any

import openai
import pytest

from accord.core.sampling_params import SamplingParams

MODEL = "accord-demo-random"
PROMPT = "The capital of France is"
MESSAGES = [{"role": "user", "content": "Tell me a joke."}]
#: ignore_eos: exact token counts (the random weights may emit EOS anywhere);
#: return_tokens_as_token_ids: logprobs name tokens by id, exact even for partial characters.
EXACT = {"ignore_eos": True, "return_tokens_as_token_ids": True}
GREEDY = SamplingParams(temperature=0.0, max_tokens=12, ignore_eos=True)


def complete(client: openai.OpenAI, **request: Any) -> Any:
    """A completion of PROMPT by the demo model, with `request` overriding."""
    return client.completions.create(**{"model": MODEL, "prompt": PROMPT, "extra_body": EXACT, **request})


def chat(client: openai.OpenAI, **request: Any) -> Any:
    """A chat completion of MESSAGES by the demo model, with `request` overriding."""
    return client.chat.completions.create(**{"model": MODEL, "messages": MESSAGES, "extra_body": EXACT, **request})


def test_completion_text_equals_offline_greedy_text(client: openai.OpenAI, offline_llm) -> None:
    [expected] = offline_llm.generate(PROMPT, GREEDY, use_tqdm=False)
    assert complete(client, max_tokens=12, temperature=0).choices[0].text == expected.outputs[0].text


def test_streamed_completion_text_equals_offline_greedy_text(client: openai.OpenAI, offline_llm) -> None:
    [expected] = offline_llm.generate(PROMPT, GREEDY, use_tqdm=False)
    stream = complete(client, max_tokens=12, temperature=0, stream=True)
    assert "".join(chunk.choices[0].text for chunk in stream) == expected.outputs[0].text


def offline_chat(offline_llm, messages: list[dict[str, str]]) -> Any:
    """The offline API's greedy answer to a conversation rendered by the chat template."""
    prompt = offline_llm.get_tokenizer().apply_chat_template(messages, add_generation_prompt=True, tokenize=True)
    [output] = offline_llm.generate({"prompt_token_ids": prompt}, GREEDY, use_tqdm=False)
    return output


def test_chat_text_equals_offline_greedy_chat_text(client: openai.OpenAI, offline_llm) -> None:
    expected = offline_chat(offline_llm, MESSAGES)
    assert chat(client, max_completion_tokens=12, temperature=0).choices[0].message.content == expected.outputs[0].text


def test_streamed_chat_text_equals_offline_greedy_chat_text(client: openai.OpenAI, offline_llm) -> None:
    expected = offline_chat(offline_llm, MESSAGES)
    chunks = list(chat(client, max_completion_tokens=12, temperature=0, stream=True))
    assert chunks[0].choices[0].delta.role == "assistant"
    assert "".join(chunk.choices[0].delta.content or "" for chunk in chunks) == expected.outputs[0].text


def test_first_streamed_token_is_token_zero_of_the_whole_result(client: openai.OpenAI) -> None:
    whole = complete(client, max_tokens=8, temperature=0, logprobs=0)
    first_chunk = next(iter(complete(client, max_tokens=8, temperature=0, logprobs=0, stream=True)))
    assert first_chunk.choices[0].logprobs.tokens[0] == whole.choices[0].logprobs.tokens[0]


def test_usage_counts_the_tokens_produced(client: openai.OpenAI) -> None:
    completion = complete(client, max_tokens=7, logprobs=0)
    assert completion.usage.completion_tokens == len(completion.choices[0].logprobs.tokens) == 7
    assert completion.usage.total_tokens == completion.usage.prompt_tokens + 7


def test_streamed_usage_arrives_last_and_counts_the_streamed_tokens(client: openai.OpenAI) -> None:
    chunks = list(chat(client, max_tokens=5, logprobs=True, stream=True, stream_options={"include_usage": True}))
    streamed_tokens = sum(len(chunk.choices[0].logprobs.content) for chunk in chunks[1:-1])
    assert chunks[-1].choices == [] and chunks[-1].usage.completion_tokens == streamed_tokens == 5
    assert all(chunk.usage is None for chunk in chunks[:-1])


def test_n_gives_n_choices(client: openai.OpenAI) -> None:
    completion = complete(client, max_tokens=3, n=3, seed=1)
    assert sorted(choice.index for choice in completion.choices) == [0, 1, 2]
    assert completion.usage.completion_tokens == 9


def test_seeded_sampling_repeats(client: openai.OpenAI) -> None:
    request = {"max_tokens": 8, "temperature": 1.0, "top_p": 0.9, "seed": 7}
    assert complete(client, **request).choices[0].text == complete(client, **request).choices[0].text


def test_stop_string_ends_the_text_before_it(client: openai.OpenAI) -> None:
    free = complete(client, max_tokens=12, temperature=0).choices[0].text
    stop = free[3:6]
    stopped = complete(client, max_tokens=12, temperature=0, stop=[stop]).choices[0]
    assert stopped.finish_reason == "stop"
    assert stopped.text == free[: free.index(stop)]


def test_top_logprobs_lists_the_requested_number_of_alternatives(client: openai.OpenAI) -> None:
    response = chat(client, max_tokens=3, logprobs=True, top_logprobs=4)
    assert [len(entry.top_logprobs) for entry in response.choices[0].logprobs.content] == [4, 4, 4]


def test_greedy_token_is_the_top_logprob(client: openai.OpenAI) -> None:
    logprobs = complete(client, max_tokens=4, temperature=0, logprobs=3).choices[0].logprobs
    for token, alternatives in zip(logprobs.tokens, logprobs.top_logprobs):
        assert max(alternatives, key=alternatives.get) == token


def test_prompt_as_token_ids_is_accepted(client: openai.OpenAI, offline_llm) -> None:
    token_ids = offline_llm.get_tokenizer().encode(PROMPT)
    by_ids = complete(client, prompt=token_ids, max_tokens=6, temperature=0)
    assert by_ids.choices[0].text == complete(client, max_tokens=6, temperature=0).choices[0].text


def test_a_list_of_prompts_gets_one_choice_per_prompt_in_order(client: openai.OpenAI) -> None:
    prompts = [PROMPT, "Hello"]
    batch = complete(client, prompt=prompts, max_tokens=4, temperature=0)
    singles = [complete(client, prompt=prompt, max_tokens=4, temperature=0).choices[0].text for prompt in prompts]
    assert [choice.text for choice in sorted(batch.choices, key=lambda choice: choice.index)] == singles


def test_models_lists_the_demo_model_as_random_weights(client: openai.OpenAI) -> None:
    [model] = client.models.list().data
    assert model.id == MODEL
    assert "random weights" in model.model_extra["description"]


@pytest.mark.parametrize("max_tokens", [1, 2])
def test_tiny_budgets_finish_by_length(client: openai.OpenAI, max_tokens: int) -> None:
    completion = complete(client, max_tokens=max_tokens)
    assert completion.choices[0].finish_reason == "length"
    assert completion.usage.completion_tokens == max_tokens
