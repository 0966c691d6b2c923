"""vLLM's request extensions and response shapes (vllm/entrypoints/openai/*/protocol.py
and serving.py of vLLM 0.33), on the shared demo-model server: each field is honoured
or refused with a 400 naming it. Expected token ids and texts come from the tokenizers
library reading the model's tokenizer.json, not from the server."""

from __future__ import annotations

import json
from pathlib import Path

import httpx
import openai
import pytest
import tokenizers

MODEL = "accord-demo-random"
CHAT, COMPLETIONS = "/v1/chat/completions", "/v1/completions"
HELLO = [{"role": "user", "content": "hello there"}]


@pytest.fixture(scope="module")
def tokenizer(demo_model: Path) -> tokenizers.Tokenizer:
    return tokenizers.Tokenizer.from_file(str(demo_model / "tokenizer.json"))


def post(http: httpx.Client, route: str, **body) -> dict:
    response = http.post(route, json=body)
    assert response.status_code == 200, response.text
    return response.json()


# -- token ids, truncation, echo ---------------------------------------------------------
def test_return_token_ids_gives_the_prompt_and_output_ids(http: httpx.Client, tokenizer) -> None:
    body = post(http, COMPLETIONS, prompt="hello there", max_tokens=4, return_token_ids=True, ignore_eos=True)
    choice = body["choices"][0]
    assert choice["prompt_token_ids"] == tokenizer.encode("hello there").ids
    assert len(choice["token_ids"]) == 4 and tokenizer.decode(choice["token_ids"]) == choice["text"]
    chat = post(http, CHAT, messages=HELLO, max_tokens=3, return_token_ids=True, ignore_eos=True)
    assert chat["prompt_token_ids"] and len(chat["choices"][0]["token_ids"]) == 3
    assert post(http, COMPLETIONS, prompt="hi", max_tokens=1)["choices"][0]["token_ids"] is None


def test_streamed_token_ids_add_up_and_the_first_chunk_has_the_prompts(http: httpx.Client, tokenizer) -> None:
    body = {"prompt": "hello there", "max_tokens": 5, "ignore_eos": True, "return_token_ids": True, "stream": True}
    with http.stream("POST", COMPLETIONS, json=body) as response:
        chunks = [json.loads(line[6:]) for line in response.iter_lines() if line.startswith("data: {")]
    assert chunks[0]["choices"][0]["prompt_token_ids"] == tokenizer.encode("hello there").ids
    assert all(chunk["choices"][0]["prompt_token_ids"] is None for chunk in chunks[1:])
    ids = [t for chunk in chunks for t in chunk["choices"][0]["token_ids"]]
    assert len(ids) == 5 and tokenizer.decode(ids) == "".join(chunk["choices"][0]["text"] for chunk in chunks)


@pytest.mark.parametrize(("side", "keep"), [(None, slice(-3, None)), ("left", slice(-3, None)), ("right", slice(0, 3))])
def test_truncate_prompt_tokens_keeps_the_named_end(http: httpx.Client, tokenizer, side, keep) -> None:
    prompt = "one two three four five six"
    extra = {} if side is None else {"truncation_side": side}
    choice = post(http, COMPLETIONS, prompt=prompt, max_tokens=1, truncate_prompt_tokens=3, return_token_ids=True,
                  **extra)["choices"][0]
    assert choice["prompt_token_ids"] == tokenizer.encode(prompt).ids[keep]


def test_echo_of_token_ids_keeps_special_tokens(http: httpx.Client, tokenizer) -> None:
    choice = post(http, COMPLETIONS, prompt=[0, 0, 0], max_tokens=1, echo=True)["choices"][0]
    echoed = tokenizer.decode([0, 0, 0], skip_special_tokens=False)
    assert echoed and choice["text"].startswith(echoed)


def test_a_last_incomplete_character_stays_as_u_fffd(http: httpx.Client, tokenizer) -> None:
    # Token 195 is the first byte of "é" in the demo tokenizer: alone it is no character.
    body = post(http, CHAT, messages=HELLO, max_tokens=1, temperature=0, logit_bias={"195": 100},
                return_token_ids=True)
    choice = body["choices"][0]
    assert choice["token_ids"] == [195]
    assert choice["message"]["content"] == tokenizer.decode([195]) == "\ufffd"


# -- chat templates -------------------------------------------------------------------------
def test_continue_final_message_ends_the_prompt_inside_the_last_message(http: httpx.Client, tokenizer) -> None:
    messages = [*HELLO, {"role": "assistant", "content": "The answer is"}]
    body = post(http, CHAT, messages=messages, max_tokens=1, add_generation_prompt=False,
                continue_final_message=True, return_token_ids=True)
    assert tokenizer.decode(body["prompt_token_ids"], skip_special_tokens=False).endswith("The answer is")
    both = http.post(CHAT, json={"messages": messages, "continue_final_message": True, "max_tokens": 1})
    assert both.status_code == 400 and both.json()["error"]["param"] == "continue_final_message"


def test_add_generation_prompt_false_leaves_the_assistant_header_out(http: httpx.Client, tokenizer) -> None:
    def prompt(add: bool) -> str:
        ids = post(http, CHAT, messages=HELLO, max_tokens=1, add_generation_prompt=add, return_token_ids=True)
        return tokenizer.decode(ids["prompt_token_ids"], skip_special_tokens=False)

    assert prompt(True).endswith("<|start_header_id|>assistant<|end_header_id|>\n\n")
    assert prompt(False).endswith("hello there<|eot_id|>")


@pytest.mark.parametrize("stream", [False, True], ids=["whole", "streamed"])
def test_chat_echo_begins_with_the_last_assistant_message(http: httpx.Client, stream: bool) -> None:
    messages = [*HELLO, {"role": "assistant", "content": "Sure:"}]
    body = {"messages": messages, "max_tokens": 3, "echo": True, "add_generation_prompt": False,
            "continue_final_message": True, "ignore_eos": True}
    if stream:
        with http.stream("POST", CHAT, json={**body, "stream": True}) as response:
            chunks = [json.loads(line[6:]) for line in response.iter_lines() if line.startswith("data: {")]
        content = "".join(chunk["choices"][0]["delta"].get("content") or "" for chunk in chunks if chunk["choices"])
    else:
        content = post(http, CHAT, **body)["choices"][0]["message"]["content"]
    assert content.startswith("Sure:") and len(content) > len("Sure:")


def test_a_custom_role_reaches_the_template(http: httpx.Client, tokenizer) -> None:
    body = post(http, CHAT, messages=[{"role": "my-custom-role", "content": "hi"}], max_tokens=1,
                return_token_ids=True)
    assert "<|start_header_id|>my-custom-role<|end_header_id|>" in tokenizer.decode(
        body["prompt_token_ids"], skip_special_tokens=False)


def test_a_request_chat_template_needs_the_servers_trust(http: httpx.Client) -> None:
    response = http.post(CHAT, json={"messages": HELLO, "chat_template": "{{ messages[0]['content'] }}"})
    assert response.status_code == 400 and response.json()["error"]["param"] == "chat_template"


def test_chat_template_kwargs_and_documents_reach_the_template(http: httpx.Client) -> None:
    # The demo template ignores unknown variables: the request is served, not refused.
    body = post(http, CHAT, messages=HELLO, max_tokens=1, chat_template_kwargs={"enable_thinking": False},
                documents=[{"title": "t", "text": "x"}])
    assert body["object"] == "chat.completion"


# -- logprobs ---------------------------------------------------------------------------------
def test_logprobs_0_gives_the_chosen_token_alone(http: httpx.Client) -> None:
    logprobs = post(http, COMPLETIONS, prompt="hi", max_tokens=3, logprobs=0, ignore_eos=True)["choices"][0]["logprobs"]
    assert [list(top) for top in logprobs["top_logprobs"]] == [[token] for token in logprobs["tokens"]]
    assert [top[token] for top, token in zip(logprobs["top_logprobs"], logprobs["tokens"])] == \
        logprobs["token_logprobs"]


def test_top_logprobs_lead_with_the_chosen_token(http: httpx.Client) -> None:
    # temperature 2 samples tokens that are often not the most likely.
    completion = post(http, COMPLETIONS, prompt="hi", max_tokens=8, logprobs=2, temperature=2.0, seed=3,
                      ignore_eos=True)["choices"][0]["logprobs"]
    for token, top in zip(completion["tokens"], completion["top_logprobs"]):
        assert next(iter(top)) == token and len(top) in (2, 3)  # the chosen, then the top 2 (vLLM: logprobs + 1)
    chat = post(http, CHAT, messages=HELLO, max_tokens=8, logprobs=True, top_logprobs=2, temperature=2.0, seed=3,
                ignore_eos=True)["choices"][0]["logprobs"]["content"]
    for entry in chat:
        assert entry["top_logprobs"][0]["token"] == entry["token"] and len(entry["top_logprobs"]) == 2


def test_prompt_logprobs_come_per_prompt_token(http: httpx.Client, tokenizer) -> None:
    prompt = "hello there friend"
    ids = tokenizer.encode(prompt).ids
    choice = post(http, COMPLETIONS, prompt=prompt, max_tokens=1, prompt_logprobs=2)["choices"][0]
    entries = choice["prompt_logprobs"]
    assert len(entries) == len(ids) and entries[0] is None
    for token_id, entry in zip(ids[1:], entries[1:]):
        assert str(token_id) in entry and 2 <= len(entry) <= 3
        assert set(entry[str(token_id)]) == {"logprob", "rank", "decoded_token"}
    # The same numbers echo gives through the legacy logprobs lists.
    echoed = post(http, COMPLETIONS, prompt=prompt, max_tokens=0, echo=True, logprobs=2)["choices"][0]["logprobs"]
    assert echoed["token_logprobs"][1:] == [entry[str(t)]["logprob"] for t, entry in zip(ids[1:], entries[1:])]
    chat = post(http, CHAT, messages=HELLO, max_tokens=1, prompt_logprobs=0)
    assert chat["prompt_logprobs"][0] is None and all(len(entry) == 1 for entry in chat["prompt_logprobs"][1:])


@pytest.mark.parametrize(("route", "body", "param"), [
    (COMPLETIONS, {"prompt": "hi", "logprobs": -1}, "logprobs"),
    (COMPLETIONS, {"prompt": "hi", "prompt_logprobs": 21}, "prompt_logprobs"),
    (CHAT, {"messages": HELLO, "logprobs": True, "top_logprobs": 21}, "top_logprobs"),
])
def test_logprobs_past_max_logprobs_get_400(http: httpx.Client, route, body, param) -> None:
    response = http.post(route, json={**body, "max_tokens": 1})
    assert response.status_code == 400 and response.json()["error"]["param"] == param


# -- usage ---------------------------------------------------------------------------------------
def test_continuous_usage_stats_put_usage_on_every_chunk(http: httpx.Client) -> None:
    body = {"prompt": "hello", "max_tokens": 4, "ignore_eos": True, "stream": True,
            "stream_options": {"include_usage": True, "continuous_usage_stats": True}}
    with http.stream("POST", COMPLETIONS, json=body) as response:
        chunks = [json.loads(line[6:]) for line in response.iter_lines() if line.startswith("data: {")]
    assert all(chunk["usage"] is not None for chunk in chunks)
    counts = [chunk["usage"]["completion_tokens"] for chunk in chunks]
    assert counts == sorted(counts) and counts[-1] == 4 and chunks[-1]["choices"] == []
    assert {chunk["usage"]["prompt_tokens"] for chunk in chunks} == {chunks[-1]["usage"]["prompt_tokens"]}


def test_usage_has_no_prompt_details_unless_the_server_enables_them(http: httpx.Client) -> None:
    assert post(http, COMPLETIONS, prompt="hi", max_tokens=1)["usage"]["prompt_tokens_details"] is None


# -- refused fields and /tokenize ---------------------------------------------------------------
@pytest.mark.parametrize("field, value", [
    ("logprob_token_ids", [1, 2]), ("allowed_token_ids", [1, 2]), ("bad_words", ["x"]),
    ("spaces_between_special_tokens", False),
])
@pytest.mark.parametrize("route", [COMPLETIONS, CHAT])
def test_vllm_fields_accord_lacks_get_400_naming_them(http: httpx.Client, route, field, value) -> None:
    body = {"prompt": "hi"} if route == COMPLETIONS else {"messages": HELLO}
    response = http.post(route, json={**body, field: value, "max_tokens": 1})
    assert response.status_code == 400, response.text
    assert response.json()["error"]["param"] == field and response.json()["error"]["code"] == "unsupported_parameter"


def test_empty_vllm_defaults_are_not_refused(http: httpx.Client) -> None:
    assert post(http, COMPLETIONS, prompt="hi", max_tokens=1, bad_words=[], allowed_token_ids=None)["choices"]


def test_tokenize_gives_token_strs_when_asked(http: httpx.Client, tokenizer) -> None:
    plain = post(http, "/tokenize", prompt="hello there")
    assert plain["token_strs"] is None and plain["tokens"] == tokenizer.encode("hello there").ids
    asked = post(http, "/tokenize", prompt="hello there", return_token_strs=True)
    assert asked["token_strs"] == [tokenizer.decode([t], skip_special_tokens=False) for t in asked["tokens"]]


def test_the_openai_client_reads_the_extended_chat_response(client: openai.OpenAI) -> None:
    response = client.chat.completions.create(
        model=MODEL, messages=HELLO, max_tokens=2, extra_body={"return_token_ids": True, "prompt_logprobs": 0}
    )
    extra = response.model_extra or {}
    assert extra["prompt_token_ids"] and extra["prompt_logprobs"][0] is None
