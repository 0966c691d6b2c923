"""logit_bias in the sampling path, and echo with prompt logprobs (what
lm-evaluation-harness's local-completions model sends for loglikelihood tasks)."""

from __future__ import annotations

import math

import httpx
import openai
from accord.demo.model import DEMO_MODEL_NAME

MODEL = DEMO_MODEL_NAME
HELLO = [{"role": "user", "content": "hi"}]


def first_token(http: httpx.Client, **extra) -> int:
    body = {"prompt": "Hello", "max_tokens": 1, "temperature": 0, "return_tokens_as_token_ids": True, "logprobs": 0}
    token = http.post("/v1/completions", json={**body, **extra}).json()["choices"][0]["logprobs"]["tokens"][0]
    return int(token.removeprefix("token_id:"))


def test_logit_bias_moves_the_greedy_choice(http: httpx.Client) -> None:
    greedy = first_token(http)
    forced = (greedy + 7) % 800
    assert first_token(http, logit_bias={str(forced): 100}) == forced
    assert first_token(http, logit_bias={str(greedy): -100}) != greedy


def test_echo_scores_a_prompt_with_the_logprobs_generation_gave(client: openai.OpenAI, http: httpx.Client) -> None:
    # Generate greedily with logprobs, then score prompt + generation with echo: the
    # prompt logprobs of the generated tokens must equal the sampled logprobs (two
    # code paths: prompt rows of a prefill against sampling rows of decodes).
    generated = client.completions.create(
        model=MODEL, prompt="The quick brown", max_tokens=4, temperature=0, logprobs=0,
        extra_body={"ignore_eos": True, "return_tokens_as_token_ids": True},
    ).choices[0]
    prompt_ids = http.post("/tokenize", json={"prompt": "The quick brown"}).json()["tokens"]
    new_ids = [int(t.removeprefix("token_id:")) for t in generated.logprobs.tokens]
    scored = client.completions.create(
        model=MODEL, prompt=prompt_ids + new_ids, max_tokens=0, echo=True, logprobs=1,
        extra_body={"return_tokens_as_token_ids": True},
    )
    choice = scored.choices[0]
    assert scored.usage.completion_tokens == 0
    assert choice.logprobs.tokens == [f"token_id:{t}" for t in prompt_ids + new_ids]
    assert choice.logprobs.token_logprobs[0] is None and choice.logprobs.top_logprobs[0] is None
    echoed = choice.logprobs.token_logprobs[len(prompt_ids):]
    assert all(math.isclose(a, b, rel_tol=1e-4, abs_tol=1e-4) for a, b in zip(echoed, generated.logprobs.token_logprobs))
    assert all(len(top) >= 1 for top in choice.logprobs.top_logprobs[1:])


def test_echo_with_generation_prefixes_the_prompt(client: openai.OpenAI) -> None:
    choice = client.completions.create(
        model=MODEL, prompt="Once upon", max_tokens=3, echo=True, temperature=0, extra_body={"ignore_eos": True}
    ).choices[0]
    plain = client.completions.create(
        model=MODEL, prompt="Once upon", max_tokens=3, temperature=0, extra_body={"ignore_eos": True}
    ).choices[0]
    assert choice.text == "Once upon" + plain.text


def test_echo_streams_the_prompt_first(client: openai.OpenAI) -> None:
    chunks = list(client.completions.create(model=MODEL, prompt="Once upon", max_tokens=2, echo=True, stream=True))
    assert chunks[0].choices[0].text.startswith("Once upon")
