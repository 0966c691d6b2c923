"""Structured output through the official openai client on the demo model: whenever a
constrained request finishes with "stop", its text parses and matches the constraint
(checked by jsonschema and re, not by the code under test). The demo model's weights
are random, so only the constraint can make its output valid."""

from __future__ import annotations

import json
import re

import jsonschema
import openai
import pytest
from accord.demo.model import DEMO_MODEL_NAME

MODEL = DEMO_MODEL_NAME
HELLO = [{"role": "user", "content": "Describe a city."}]
SCHEMA = {
    "type": "object",
    "properties": {
        "ok": {"type": "boolean"},
        "n": {"type": "integer", "minimum": 0, "maximum": 9},
        "city": {"enum": ["Paris", "Rome", "Oslo"]},
    },
    "required": ["ok", "n", "city"],
    "additionalProperties": False,
}
SEEDS = range(3)


def stream_text(stream) -> tuple[str, str | None]:
    text, finish_reason = "", None
    for chunk in stream:
        for choice in chunk.choices:
            text += choice.delta.content or ""
            finish_reason = choice.finish_reason or finish_reason
    return text, finish_reason


@pytest.mark.slow
@pytest.mark.parametrize("stream", [False, True], ids=["whole", "streamed"])
def test_response_format_json_schema_output_validates(client: openai.OpenAI, stream: bool) -> None:
    response_format = {"type": "json_schema", "json_schema": {"name": "city", "schema": SCHEMA}}
    finished = 0
    for seed in SEEDS:
        kwargs = dict(model=MODEL, messages=HELLO, max_tokens=60, seed=seed, response_format=response_format)
        if stream:
            text, finish_reason = stream_text(client.chat.completions.create(stream=True, **kwargs))
        else:
            choice = client.chat.completions.create(**kwargs).choices[0]
            text, finish_reason = choice.message.content, choice.finish_reason
        if finish_reason == "stop":
            jsonschema.validate(json.loads(text), SCHEMA)
            finished += 1
    assert finished, "no constrained request ran to its end"


def test_response_format_json_object_is_an_object(client: openai.OpenAI) -> None:
    choice = client.chat.completions.create(
        model=MODEL, messages=HELLO, max_tokens=80, seed=1, response_format={"type": "json_object"},
        extra_body={"logit_bias": {}},
    ).choices[0]
    if choice.finish_reason == "stop":
        assert isinstance(json.loads(choice.message.content), dict)
    else:  # cut by length: still a prefix of an object
        assert choice.message.content.startswith("{")


@pytest.mark.parametrize(
    ("extra", "check"),
    [
        ({"guided_regex": r"[a-c]{3}-[0-9]{2}"}, lambda text: re.fullmatch(r"[a-c]{3}-[0-9]{2}", text)),
        ({"guided_choice": ["yes", "no", "maybe"]}, lambda text: text in {"yes", "no", "maybe"}),
        ({"structured_outputs": {"choice": ["left", "right"]}}, lambda text: text in {"left", "right"}),
        ({"guided_grammar": 'start: "x" ("+" "x")*'}, lambda text: re.fullmatch(r"x(\+x)*", text)),
        ({"guided_grammar": 'root ::= "y" | "z"'}, lambda text: text in {"y", "z"}),  # GBNF
        ({"guided_json": SCHEMA}, lambda text: jsonschema.validate(json.loads(text), SCHEMA) is None),
    ],
    ids=["regex", "choice", "structured_outputs", "lark", "gbnf", "guided_json"],
)
@pytest.mark.parametrize("stream", [False, True], ids=["whole", "streamed"])
def test_vllm_guided_fields_constrain_completions(client: openai.OpenAI, extra: dict, check, stream: bool) -> None:
    kwargs = dict(model=MODEL, prompt="Answer:", max_tokens=60, seed=0, extra_body=extra)
    if stream:
        text, finish_reason = "", None
        for chunk in client.completions.create(stream=True, **kwargs):
            text += chunk.choices[0].text
            finish_reason = chunk.choices[0].finish_reason or finish_reason
    else:
        choice = client.completions.create(**kwargs).choices[0]
        text, finish_reason = choice.text, choice.finish_reason
    assert finish_reason == "stop", text
    assert check(text), text


@pytest.mark.parametrize(
    ("extra", "param"),
    [
        ({"guided_regex": "(unclosed"}, "guided_regex"),
        ({"guided_json": {"type": "objectx"}}, "guided_json"),
        ({"guided_grammar": "start: (("}, "guided_grammar"),
        ({"guided_regex": "a", "guided_choice": ["b"]}, "guided_choice"),
        ({"structured_outputs": {}}, "structured_outputs"),
    ],
)
def test_invalid_constraints_get_400(client: openai.OpenAI, extra: dict, param: str) -> None:
    with pytest.raises(openai.BadRequestError) as raised:
        client.completions.create(model=MODEL, prompt="x", max_tokens=5, extra_body=extra)
    assert raised.value.body["param"] == param or "constraint" in raised.value.body["message"]
