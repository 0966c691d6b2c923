"""The `mistral` and `qwen3_xml` tool parsers on the texts those models write (taken from
vLLM's parser tests and the models' chat templates), whole and streamed by character and
in chunks: the calls, their JSON-typed arguments, the content around them, and the
pieces a stream sends (a call's name first, then its arguments as they arrive)."""

from __future__ import annotations

import json

import pytest

from accord.server.tool_parsers import MistralToolParser, Qwen3XmlToolParser, ToolParser

WEATHER = {"name": "get_current_weather", "parameters": {"type": "object", "properties": {
    "city": {"type": "string"}, "state": {"type": "string"}, "unit": {"type": "string", "enum": ["fahrenheit", "celsius"]}},
    "required": ["city", "state"]}}
AREA = {"name": "calculate_area", "parameters": {"type": "object", "properties": {
    "shape": {"type": "string"}, "dimensions": {"type": "object"}, "precision": {"type": "integer"}}}}
QWEN_TOOLS = [WEATHER, AREA]

DALLAS = ("<tool_call>\n<function=get_current_weather>\n<parameter=city>\nDallas\n</parameter>\n"
          "<parameter=state>\nTX\n</parameter>\n<parameter=unit>\nfahrenheit\n</parameter>\n</function>\n</tool_call>")
ORLANDO = DALLAS.replace("Dallas", "Orlando").replace("TX", "FL")
#: (model output, expected calls, expected content), as vLLM's qwen3_coder tests write them.
QWEN_CASES = {
    "single": (DALLAS, [("get_current_weather", {"city": "Dallas", "state": "TX", "unit": "fahrenheit"})], None),
    "with-content": ("Sure! Let me check the weather for you." + DALLAS,
                     [("get_current_weather", {"city": "Dallas", "state": "TX", "unit": "fahrenheit"})],
                     "Sure! Let me check the weather for you."),
    "multiline-json": ("<tool_call>\n<function=calculate_area>\n<parameter=shape>\nrectangle\n</parameter>\n"
                       '<parameter=dimensions>\n{"width": 10, \n "height": 20}\n</parameter>\n'
                       "<parameter=precision>\n2\n</parameter>\n</function>\n</tool_call>",
                       [("calculate_area", {"shape": "rectangle", "dimensions": {"width": 10, "height": 20},
                                            "precision": 2})], None),
    "parallel": (DALLAS + "\n" + ORLANDO,
                 [("get_current_weather", {"city": "Dallas", "state": "TX", "unit": "fahrenheit"}),
                  ("get_current_weather", {"city": "Orlando", "state": "FL", "unit": "fahrenheit"})], None),
}


def streamed(parser: ToolParser, text: str, size: int) -> tuple[str, list[tuple[str, dict]], list[list[str]]]:
    """`text` fed `size` characters at a time: the content, the assembled calls, and each
    call's arguments pieces in the order they came."""
    pieces = [parser.feed(text[i : i + size]) for i in range(0, len(text), size)] + [parser.finish()]
    names: dict[int, str] = {}
    arguments: dict[int, list[str]] = {}
    for piece in pieces:
        for delta in piece.calls:
            if delta.name is not None:
                assert delta.index not in names and delta.index == len(names)  # named once, in order
                names[delta.index] = delta.name
            arguments.setdefault(delta.index, []).append(delta.arguments)
    calls = [(names[i], json.loads("".join(arguments[i]))) for i in sorted(names)]
    return "".join(piece.content for piece in pieces), calls, [arguments[i] for i in sorted(names)]


@pytest.mark.parametrize("case", QWEN_CASES)
def test_qwen3_xml_reads_whole_outputs(case: str) -> None:
    text, calls, content = QWEN_CASES[case]
    extracted = Qwen3XmlToolParser(QWEN_TOOLS).extract(text)
    assert [(call.name, json.loads(call.arguments)) for call in extracted.calls] == calls
    assert extracted.content == content


@pytest.mark.parametrize("size", [1, 7], ids=["by-character", "in-chunks"])
@pytest.mark.parametrize("case", QWEN_CASES)
def test_qwen3_xml_streams_the_same_calls(case: str, size: int) -> None:
    text, calls, content = QWEN_CASES[case]
    streamed_content, streamed_calls, _ = streamed(Qwen3XmlToolParser(QWEN_TOOLS), text, size)
    assert streamed_calls == calls
    assert streamed_content.strip() == (content or "")


def test_qwen3_xml_streams_a_string_value_before_its_closing_tag() -> None:
    parser = Qwen3XmlToolParser(QWEN_TOOLS)
    opened = parser.feed("<tool_call>\n<function=get_current_weather>\n<parameter=city>\nDal")
    assert [(d.index, d.name) for d in opened.calls][0] == (0, "get_current_weather")
    assert "".join(d.arguments for d in opened.calls) == '{"city": "Dal'
    # A newline may be the template's own before </parameter>: held back until known.
    assert "".join(d.arguments for d in parser.feed("las\n</para").calls) == "las"
    assert "".join(d.arguments for d in parser.feed("meter>\n").calls) == '"'


def test_qwen3_xml_holds_a_typed_value_until_it_closes() -> None:
    parser = Qwen3XmlToolParser(QWEN_TOOLS)
    parser.feed("<tool_call>\n<function=calculate_area>\n")
    assert parser.feed("<parameter=precision>\n1").calls == []  # 1 or 12 or 1.5: not known yet
    assert "".join(d.arguments for d in parser.feed("2\n</parameter>\n").calls) == '{"precision": 12'
    assert "".join(d.arguments for d in parser.feed("</function>\n</tool_call>").calls) == "}"


def test_qwen3_xml_types_values_by_the_schema() -> None:
    # vLLM's type-conversion cases: integer, "float", boolean, string, object, and
    # pydantic's Optional (anyOf with null), a type list, and a $ref into $defs.
    tool = {"name": "test_types", "parameters": {"type": "object", "$defs": {"Count": {"type": "integer"}}, "properties": {
        "int_param": {"type": "integer"}, "float_param": {"type": "float"}, "bool_param": {"type": "boolean"},
        "str_param": {"type": "string"}, "obj_param": {"type": "object"},
        "anyof_int": {"anyOf": [{"type": "integer"}, {"type": "null"}]},
        "anyof_array": {"anyOf": [{"type": "array", "items": {"type": "string"}}, {"type": "null"}]},
        "type_as_array": {"type": ["integer", "null"]}, "null_param": {"type": ["integer", "null"]},
        "multi_non_null": {"anyOf": [{"type": "string"}, {"type": "integer"}, {"type": "null"}]},
        "ref_param": {"$ref": "#/$defs/Count"}, "digits_string": {"type": "string"}}}}
    values = {"int_param": "42", "float_param": "3.14", "bool_param": "true", "str_param": "hello world",
              "obj_param": '{"key": "value"}', "anyof_int": "5", "anyof_array": '["a", "b", "c"]', "type_as_array": "42",
              "null_param": "null", "multi_non_null": "some text", "ref_param": "7", "digits_string": "0042",
              "undeclared": "9"}
    body = "".join(f"<parameter={key}>\n{value}\n</parameter>\n" for key, value in values.items())
    text = f"<tool_call>\n<function=test_types>\n{body}</function>\n</tool_call>"
    [call] = Qwen3XmlToolParser([tool]).extract(text).calls
    assert json.loads(call.arguments) == {
        "int_param": 42, "float_param": 3.14, "bool_param": True, "str_param": "hello world",
        "obj_param": {"key": "value"}, "anyof_int": 5, "anyof_array": ["a", "b", "c"], "type_as_array": 42,
        "null_param": None, "multi_non_null": "some text", "ref_param": 7, "digits_string": "0042",
        "undeclared": "9",  # not in the schema: kept as written
    }


def test_qwen3_xml_without_the_tools_schema_keeps_strings() -> None:
    [call] = Qwen3XmlToolParser([]).extract(QWEN_CASES["multiline-json"][0]).calls
    assert json.loads(call.arguments)["precision"] == "2"


def test_qwen3_xml_leaves_text_without_calls_alone() -> None:
    text = "This is a test response without any tool calls"
    assert Qwen3XmlToolParser(QWEN_TOOLS).extract(text).content == text
    content, calls, _ = streamed(Qwen3XmlToolParser(QWEN_TOOLS), text, 3)
    assert content == text and calls == []


# -- mistral ------------------------------------------------------------------------------
ADD_AND_WEATHER = [("add", {"a": 3.5, "b": 4}),
                   ("get_current_weather", {"city": "San Francisco", "state": "CA", "unit": "celsius"})]
#: (model output, expected calls, expected content); vLLM's mistral tests' texts.
MISTRAL_CASES = {
    "pre-v11": ('[TOOL_CALLS] [{"name": "add", "arguments": {"a": 3.5, "b": 4}}, {"name": "get_current_weather", '
                '"arguments":{"city": "San Francisco", "state": "CA", "unit": "celsius"}}]', ADD_AND_WEATHER, None),
    "pre-v11-content": ('Hello[TOOL_CALLS] [{"name": "add", "arguments":{"a": 1, "b": 2}}]',
                        [("add", {"a": 1, "b": 2})], "Hello"),
    "pre-v11-bare-object": ('[TOOL_CALLS] {"name": "add", "arguments": {"a": 1}}', [("add", {"a": 1})], None),
    "v11": ('[TOOL_CALLS]add[ARGS]{"a": 3.5, "b": 4}[TOOL_CALLS]get_current_weather[ARGS]'
            '{"city": "San Francisco", "state": "CA", "unit": "celsius"}', ADD_AND_WEATHER, None),
    "v11-content": ('hi[TOOL_CALLS]add[ARGS]{"a": 1, "b": 2}', [("add", {"a": 1, "b": 2})], "hi"),
    "v11-without-args-marker": ('[TOOL_CALLS]add{"a": 3.5, "b": 4}[TOOL_CALLS]multiply{"a": 3, "b": 6}',
                                [("add", {"a": 3.5, "b": 4}), ("multiply", {"a": 3, "b": 6})], None),
    "v11-code-argument": ('hi{hi[TOOL_CALLS]bash{"command": "print(\\"hello world!\\")\\nre.compile(r\'{}\')"}',
                          [("bash", {"command": "print(\"hello world!\")\nre.compile(r'{}')"})], "hi{hi"),
}


@pytest.mark.parametrize("case", MISTRAL_CASES)
def test_mistral_reads_whole_outputs(case: str) -> None:
    text, calls, content = MISTRAL_CASES[case]
    extracted = MistralToolParser().extract(text)
    assert [(call.name, json.loads(call.arguments)) for call in extracted.calls] == calls
    assert extracted.content == content


def test_mistral_drops_text_after_a_v11_calls_arguments_and_reads_a_bare_name() -> None:
    extracted = MistralToolParser().extract('[TOOL_CALLS]get_current_weather[ARGS]{"city": "SF"}Estimating...')
    assert [(c.name, json.loads(c.arguments)) for c in extracted.calls] == [("get_current_weather", {"city": "SF"})]
    [call] = MistralToolParser().extract("[TOOL_CALLS]toolname_no_args").calls
    assert (call.name, json.loads(call.arguments)) == ("toolname_no_args", {})


@pytest.mark.parametrize("size", [1, 5], ids=["by-character", "in-chunks"])
@pytest.mark.parametrize("case", MISTRAL_CASES)
def test_mistral_streams_the_same_calls(case: str, size: int) -> None:
    text, calls, content = MISTRAL_CASES[case]
    streamed_content, streamed_calls, _ = streamed(MistralToolParser(), text, size)
    assert streamed_calls == calls
    assert streamed_content.strip() == (content or "")


def test_mistral_v11_streams_the_arguments_as_written() -> None:
    parser = MistralToolParser()
    assert parser.feed("[TOOL_CALLS]add").calls == []  # the name may go on
    [opening] = parser.feed("[ARGS]").calls
    assert (opening.index, opening.name, opening.arguments) == (0, "add", "")
    assert [d.arguments for d in parser.feed('{"a": 3').calls] == ['{"a": 3']
    assert [(d.index, d.name) for d in parser.feed(".5}[TOOL_CALLS]mul[ARGS]").calls] == [(0, None), (1, "mul")]


def test_mistral_needs_its_tool_calls_token() -> None:
    MistralToolParser.check_tokenizer({"[TOOL_CALLS]": 5})
    with pytest.raises(ValueError, match=r"\[TOOL_CALLS\]"):
        MistralToolParser.check_tokenizer({"<tool_call>": 5})


# -- through the chat endpoint -------------------------------------------------------------
WRITTEN_CALL = DALLAS.replace("<parameter=unit>\nfahrenheit\n</parameter>\n", "")


@pytest.fixture(scope="module")
def qwen3_client(demo_model, cache_dir):
    """A server parsing Qwen3-Coder's XML calls (the random demo model, made to write one by a regex)."""
    import openai
    from server_harness import ENGINE_FLAGS, ServerProcess

    process = ServerProcess("--tool-call-parser", "qwen3_xml", *ENGINE_FLAGS, cache_dir=cache_dir)
    yield openai.OpenAI(base_url=f"{process.url}/v1", api_key="unused", max_retries=0)
    process.stop()


def _regex_literal(text: str) -> str:
    return "".join("\\" + char if char in r"\.^$|?*+()[]{}/" else ("\\n" if char == "\n" else char) for char in text)


@pytest.mark.slow
@pytest.mark.parametrize("stream", [False, True], ids=["whole", "streamed"])
def test_the_chat_endpoint_parses_qwen3_xml_calls_with_typed_arguments(qwen3_client, stream: bool) -> None:
    from accord.demo.model import DEMO_MODEL_NAME

    kwargs = dict(model=DEMO_MODEL_NAME, messages=[{"role": "user", "content": "Weather in Dallas?"}],
                  tools=[{"type": "function", "function": WEATHER}], max_tokens=200,
                  extra_body={"guided_regex": _regex_literal("Checking." + WRITTEN_CALL)})
    if stream:
        content, calls, finish_reason = "", {}, None
        for chunk in qwen3_client.chat.completions.create(stream=True, **kwargs):
            delta = chunk.choices[0].delta
            content += delta.content or ""
            for part in delta.tool_calls or []:
                call = calls.setdefault(part.index, {"id": part.id, "name": part.function.name, "arguments": ""})
                assert part.id is None or part.id == call["id"]  # the id comes with the first piece only
                call["arguments"] += part.function.arguments or ""
            finish_reason = chunk.choices[0].finish_reason or finish_reason
        [call] = calls.values()
        name, arguments, call_id = call["name"], call["arguments"], call["id"]
    else:
        choice = qwen3_client.chat.completions.create(**kwargs).choices[0]
        [tool_call] = choice.message.tool_calls
        content, finish_reason = choice.message.content, choice.finish_reason
        name, arguments, call_id = tool_call.function.name, tool_call.function.arguments, tool_call.id
    assert content == "Checking." and name == "get_current_weather" and call_id
    assert json.loads(arguments) == {"city": "Dallas", "state": "TX"}
    assert finish_reason == "tool_calls"


@pytest.mark.slow
def test_required_choice_forces_a_qwen3_xml_call_matching_the_schema(qwen3_client) -> None:
    from accord.demo.model import DEMO_MODEL_NAME

    tool = {"name": "set_level", "parameters": {"type": "object", "properties": {
        "level": {"type": "integer", "minimum": 1, "maximum": 3}, "unit": {"enum": ["c", "f"]}},
        "required": ["level", "unit"]}}
    choice = qwen3_client.chat.completions.create(
        model=DEMO_MODEL_NAME, messages=[{"role": "user", "content": "Set it."}], max_tokens=120, seed=0,
        tools=[{"type": "function", "function": tool}], tool_choice="required").choices[0]
    [call] = choice.message.tool_calls
    arguments = json.loads(call.function.arguments)
    assert call.function.name == "set_level" and set(arguments) == {"level", "unit"}
    assert arguments["level"] in (1, 2, 3) and arguments["unit"] in ("c", "f")  # typed by the schema
