"""Tool calls through the official openai client on the demo model: required and named
choices are enforced by structured generation, auto parses Hermes/Qwen `<tool_call>`
blocks, calls stream as OpenAI streams them, and tool results are accepted in chat."""

from __future__ import annotations

import json

import jsonschema
import openai
import pytest

from accord.demo.model import DEMO_MODEL_NAME
from accord.server.tool_parsers import HermesToolParser, get_tool_parser
from accord.server.tool_parsers.base import tool_call_schema

MODEL = DEMO_MODEL_NAME
WEATHER_PARAMETERS = {
    "type": "object",
    "properties": {"city": {"enum": ["Paris", "Rome"]}, "unit": {"enum": ["c", "f"]}},
    "required": ["city", "unit"],
    "additionalProperties": False,
}
TOOLS = [
    {"type": "function", "function": {"name": "get_weather", "description": "Weather in a city",
                                      "parameters": WEATHER_PARAMETERS}},
    {"type": "function", "function": {"name": "get_time", "description": "Time now",
                                      "parameters": {"type": "object", "properties": {}, "additionalProperties": False}}},
]
PARAMETERS = {tool["function"]["name"]: tool["function"]["parameters"] for tool in TOOLS}
ASK = [{"role": "user", "content": "What is the weather in Paris?"}]


def check_calls(calls) -> None:
    assert calls
    for call in calls:
        assert call.type == "function" and call.id
        jsonschema.validate(json.loads(call.function.arguments), PARAMETERS[call.function.name])


@pytest.mark.parametrize("choice", ["required", {"type": "function", "function": {"name": "get_weather"}}],
                         ids=["required", "named"])
def test_forced_tool_calls_match_the_tools_schemas(client: openai.OpenAI, choice) -> None:
    response = client.chat.completions.create(
        model=MODEL, messages=ASK, tools=TOOLS, tool_choice=choice, max_tokens=120, seed=0, parallel_tool_calls=False
    )
    message, finish_reason = response.choices[0].message, response.choices[0].finish_reason
    check_calls(message.tool_calls)
    if isinstance(choice, dict):
        assert [call.function.name for call in message.tool_calls] == ["get_weather"]
        assert finish_reason == "stop"  # as OpenAI, for a named function
    else:
        assert finish_reason == "tool_calls"


def test_streamed_tool_calls_arrive_as_openai_deltas(client: openai.OpenAI) -> None:
    stream = client.chat.completions.create(
        model=MODEL, messages=ASK, tools=TOOLS, tool_choice="required", max_tokens=120, seed=0,
        parallel_tool_calls=False, stream=True,
    )
    calls: dict[int, dict] = {}
    finish_reason = None
    for chunk in stream:
        delta = chunk.choices[0].delta
        for part in delta.tool_calls or []:
            call = calls.setdefault(part.index, {"id": None, "name": None, "arguments": ""})
            if part.id is not None:  # the opening piece: id, type and name
                assert call["id"] is None and part.type == "function" and part.function.name
                call["id"], call["name"] = part.id, part.function.name
            call["arguments"] += part.function.arguments or ""
        finish_reason = chunk.choices[0].finish_reason or finish_reason
    assert finish_reason == "tool_calls" and calls
    for call in calls.values():
        jsonschema.validate(json.loads(call["arguments"]), PARAMETERS[call["name"]])


@pytest.mark.parametrize("stream", [False, True], ids=["whole", "streamed"])
def test_auto_parses_hermes_tool_calls_out_of_the_text(client: openai.OpenAI, stream: bool) -> None:
    # The random model would never write a call by itself, so a regex makes it write
    # text followed by one Hermes block; `auto` must split them.
    written = 'Checking.<tool_call>\n{"name": "get_weather", "arguments": {"city": "Rome", "unit": "c"}}\n</tool_call>'
    kwargs = dict(model=MODEL, messages=ASK, tools=TOOLS, tool_choice="auto", max_tokens=120,
                  extra_body={"guided_regex": _regex_literal(written)})
    if stream:
        content, arguments, name, finish_reason = "", "", None, None
        for chunk in client.chat.completions.create(stream=True, **kwargs):
            delta = chunk.choices[0].delta
            content += delta.content or ""
            for part in delta.tool_calls or []:
                name = part.function.name or name
                arguments += part.function.arguments or ""
            finish_reason = chunk.choices[0].finish_reason or finish_reason
    else:
        choice = client.chat.completions.create(**kwargs).choices[0]
        [call] = choice.message.tool_calls
        content, name, arguments, finish_reason = choice.message.content, call.function.name, call.function.arguments, \
            choice.finish_reason
    assert content == "Checking." and name == "get_weather"
    assert json.loads(arguments) == {"city": "Rome", "unit": "c"}
    assert finish_reason == "tool_calls"


#: What pydantic writes for nested models (`$defs` + `$ref`, a recursive one, an
#: Optional as anyOf, enums), as agent frameworks send it.
NESTED_PARAMETERS = {
    "$defs": {
        "WeatherOptions": {
            "properties": {"unit": {"enum": ["c", "f"], "type": "string"}, "days": {"type": "integer", "minimum": 1,
                                                                                   "maximum": 3}},
            "required": ["unit", "days"], "type": "object", "additionalProperties": False,
        },
        "Place": {
            "properties": {"city": {"enum": ["Paris", "Rome"]}, "near": {"anyOf": [{"$ref": "#/$defs/Place"},
                                                                                    {"type": "null"}]}},
            "required": ["city", "near"], "type": "object", "additionalProperties": False,
        },
    },
    "properties": {"place": {"$ref": "#/$defs/Place"}, "options": {"$ref": "#/$defs/WeatherOptions"}},
    "required": ["place", "options"], "type": "object", "additionalProperties": False,
}
NESTED_TOOLS = [
    {"type": "function", "function": {"name": "forecast", "parameters": NESTED_PARAMETERS}},
    # A second tool defining a same-named definition differently: the two must not mix.
    {"type": "function", "function": {"name": "other", "parameters": {
        "$defs": {"WeatherOptions": {"enum": ["x"]}}, "properties": {"o": {"$ref": "#/$defs/WeatherOptions"}},
        "required": ["o"], "type": "object", "additionalProperties": False}}},
]


@pytest.mark.parametrize("choice", ["required", {"type": "function", "function": {"name": "forecast"}}],
                         ids=["required", "named"])
def test_forced_calls_follow_schemas_with_defs_and_refs(client: openai.OpenAI, choice) -> None:
    response = client.chat.completions.create(
        model=MODEL, messages=ASK, tools=NESTED_TOOLS, tool_choice=choice, max_tokens=200, seed=0,
        parallel_tool_calls=False,
    )
    calls = response.choices[0].message.tool_calls
    assert calls
    schemas = {tool["function"]["name"]: tool["function"]["parameters"] for tool in NESTED_TOOLS}
    for call in calls:  # jsonschema resolves each tool's refs against its own schema
        jsonschema.validate(json.loads(call.function.arguments), schemas[call.function.name])
    if isinstance(choice, dict):
        assert [call.function.name for call in calls] == ["forecast"]
        assert response.choices[0].finish_reason in ("stop", "length")  # vLLM/OpenAI: "stop" for a named tool


def test_auto_choice_takes_schemas_with_defs_and_refs(client: openai.OpenAI) -> None:
    response = client.chat.completions.create(
        model=MODEL, messages=ASK, tools=NESTED_TOOLS, tool_choice="auto", max_tokens=4, seed=0
    )
    assert response.choices[0].finish_reason in ("length", "stop", "tool_calls")


@pytest.mark.parametrize("parallel", [True, False])
@pytest.mark.parametrize("stream", [False, True], ids=["whole", "streamed"])
def test_parallel_tool_calls_false_keeps_the_first_auto_call(client: openai.OpenAI, parallel: bool, stream: bool) -> None:
    one = '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Rome", "unit": "c"}}\n</tool_call>'
    two = one.replace("Rome", "Paris")
    kwargs = dict(model=MODEL, messages=ASK, tools=TOOLS, tool_choice="auto", max_tokens=200,
                  parallel_tool_calls=parallel, extra_body={"guided_regex": _regex_literal(one + two)})
    if stream:
        names: dict[int, str] = {}
        for chunk in client.chat.completions.create(stream=True, **kwargs):
            for part in chunk.choices[0].delta.tool_calls or [] if chunk.choices else []:
                names.setdefault(part.index, part.function.name)
        count = len(names)
    else:
        count = len(client.chat.completions.create(**kwargs).choices[0].message.tool_calls)
    assert count == (2 if parallel else 1)


def test_tool_choice_none_returns_text(client: openai.OpenAI) -> None:
    choice = client.chat.completions.create(
        model=MODEL, messages=ASK, tools=TOOLS, tool_choice="none", max_tokens=5, seed=0
    ).choices[0]
    assert not choice.message.tool_calls and choice.finish_reason in ("length", "stop")


def test_tool_results_are_accepted_in_the_conversation(client: openai.OpenAI) -> None:
    messages = [
        *ASK,
        {"role": "assistant", "content": None, "tool_calls": [
            {"id": "call_1", "type": "function",
             "function": {"name": "get_weather", "arguments": '{"city": "Paris", "unit": "c"}'}}]},
        {"role": "tool", "tool_call_id": "call_1", "content": '{"temperature": 21}'},
    ]
    response = client.chat.completions.create(model=MODEL, messages=messages, tools=TOOLS, max_tokens=4, seed=0)
    assert response.choices[0].finish_reason in ("length", "stop", "tool_calls")


@pytest.mark.parametrize(
    ("kwargs", "param"),
    [
        ({"tool_choice": {"type": "function", "function": {"name": "nope"}}}, "tool_choice"),
        ({"tool_choice": "required", "response_format": {"type": "json_object"}}, "tool_choice"),
    ],
)
def test_bad_tool_choices_get_400(client: openai.OpenAI, kwargs: dict, param: str) -> None:
    with pytest.raises(openai.BadRequestError) as raised:
        client.chat.completions.create(model=MODEL, messages=ASK, tools=TOOLS, max_tokens=4, **kwargs)
    assert raised.value.body["param"] == param


def test_tool_choice_without_tools_gets_400(client: openai.OpenAI) -> None:
    with pytest.raises(openai.BadRequestError):
        client.chat.completions.create(model=MODEL, messages=ASK, tool_choice="required", max_tokens=4)


# -- the parser alone -------------------------------------------------------------------
def test_parsers_are_a_registry() -> None:
    assert get_tool_parser("hermes") is get_tool_parser("qwen") is HermesToolParser
    with pytest.raises(ValueError, match="hermes"):
        get_tool_parser("nope")


def test_hermes_streaming_holds_back_a_split_tag_and_emits_whole_calls() -> None:
    parser = HermesToolParser()
    text = 'Hi <tool_call>\n{"name": "f", "arguments": {"a": 1}}\n</tool_call> bye <tool'
    pieces = [parser.feed(text[i : i + 3]) for i in range(0, len(text), 3)]
    content = "".join(p.content for p in pieces) + parser.finish().content
    calls = [call for p in pieces for call in p.calls]
    assert content == "Hi  bye <tool"
    assert [(c.name, json.loads(c.arguments)) for c in calls] == [("f", {"a": 1})]
    assert "<" not in "".join(p.content for p in pieces[:2])  # the tag was never leaked as text


def test_the_call_schema_keeps_every_kind_of_local_reference_working() -> None:
    # Draft-07 `definitions`, a root self-reference `#` and a pointer into the body.
    tree = {"type": "object", "properties": {"kids": {"type": "array", "items": {"$ref": "#"}},
                                              "size": {"$ref": "#/definitions/Size"},
                                              "same": {"$ref": "#/properties/size"}},
            "definitions": {"Size": {"enum": [1, 2]}}, "required": ["size"], "additionalProperties": False}
    schema = tool_call_schema([{"name": "tree", "parameters": tree}, *[t["function"] for t in NESTED_TOOLS]],
                              arguments_key="arguments")
    good = {"name": "tree", "arguments": {"size": 1, "same": 2, "kids": [{"size": 2, "kids": [{"size": 1}]}]}}
    jsonschema.validate(good, schema)
    for bad in ({"name": "tree", "arguments": {"size": 1, "kids": [{"size": 3}]}},
                {"name": "other", "arguments": {"o": {"unit": "c", "days": 1}}},
                {"name": "forecast", "arguments": {"place": {"city": "Rome", "near": None},
                                                   "options": {"unit": "k", "days": 1}}}):
        with pytest.raises(jsonschema.ValidationError):
            jsonschema.validate(bad, schema)


def test_hermes_leaves_malformed_blocks_as_text() -> None:
    extracted = HermesToolParser().extract("<tool_call>not json</tool_call>")
    assert extracted.calls == [] and extracted.content == "<tool_call>not json</tool_call>"


def _regex_literal(text: str) -> str:
    return "".join("\\" + char if char in r"\.^$|?*+()[]{}/" else ("\\n" if char == "\n" else char) for char in text)
