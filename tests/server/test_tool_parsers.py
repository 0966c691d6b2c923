"""The tool-call parsers by vLLM's names, each against its model family's own format:
calls split from the text whole and streamed (a marker never leaks as text), and the
forcing grammar accepts a call in that format and refuses one breaking the tool's schema,
as llguidance's matcher reads it over the demo tokenizer."""

from __future__ import annotations

import json
from pathlib import Path

import llguidance
import pytest

from accord.server.tool_parsers import (
    DeepSeekV3ToolParser,
    HermesToolParser,
    Llama3JsonToolParser,
    get_tool_parser,
    tool_parser_names,
)

TOOLS = [{"name": "get_weather", "parameters": {
    "$defs": {"Unit": {"enum": ["c", "f"]}}, "type": "object", "properties": {"unit": {"$ref": "#/$defs/Unit"}},
    "required": ["unit"], "additionalProperties": False}}]
#: Two calls as each family's chat template writes them, after some text.
WRITTEN = {
    "llama3_json": '{"name":"get_weather","parameters":{"unit":"c"}}; {"name":"get_weather","parameters":{"unit":"f"}}',
    "hermes": ('<tool_call>\n{"name":"get_weather","arguments":{"unit":"c"}}\n</tool_call>'
               '<tool_call>\n{"name":"get_weather","arguments":{"unit":"f"}}\n</tool_call>'),
    "deepseek_v3": ("<｜tool▁calls▁begin｜>"
                    '<｜tool▁call▁begin｜>function<｜tool▁sep｜>get_weather\n```json\n{"unit":"c"}\n```<｜tool▁call▁end｜>'
                    '<｜tool▁call▁begin｜>function<｜tool▁sep｜>get_weather\n```json\n{"unit":"f"}\n```<｜tool▁call▁end｜>'
                    "<｜tool▁calls▁end｜>"),
}
EXPECTED = [("get_weather", {"unit": "c"}), ("get_weather", {"unit": "f"})]


@pytest.fixture(scope="module")
def ll_tokenizer(demo_model: Path) -> llguidance.LLTokenizer:
    return llguidance.LLTokenizer((demo_model / "tokenizer.json").read_text())


def test_the_parsers_have_vllms_names() -> None:
    assert {"hermes", "qwen", "deepseek_v3", "llama3_json"} <= set(tool_parser_names())
    assert get_tool_parser("llama3_json") is Llama3JsonToolParser
    assert get_tool_parser("deepseek_v3") is DeepSeekV3ToolParser and get_tool_parser("hermes") is HermesToolParser


#: Formats whose calls sit inside text (llama3_json's whole answer is the calls).
DELIMITED = ("hermes", "deepseek_v3")
LLAMA3 = '<|python_tag|>{"name": "get_weather", "parameters": {"unit": "c"}}; {"name": "get_weather", "parameters": {"unit": "f"}}'


@pytest.mark.parametrize("text", [LLAMA3, LLAMA3.removeprefix("<|python_tag|>")], ids=["tagged", "bare"])
def test_llama3_json_reads_a_whole_answer_of_calls(text: str) -> None:
    extracted = Llama3JsonToolParser().extract(text)
    assert extracted.content is None
    assert [(call.name, json.loads(call.arguments)) for call in extracted.calls] == EXPECTED
    parser = Llama3JsonToolParser()
    pieces = [parser.feed(text[i : i + 3]) for i in range(0, len(text), 3)]
    assert all(piece.content == "" and piece.calls == [] for piece in pieces)  # held until the end
    ended = parser.finish()
    assert ended.content == "" and [(c.name, json.loads(c.arguments)) for c in ended.calls] == EXPECTED


@pytest.mark.parametrize("text", ["The weather is fine.", "{not json at all", " <|python_tag|> nothing"])
def test_llama3_json_leaves_other_answers_as_text(text: str) -> None:
    assert Llama3JsonToolParser().extract(text).calls == []
    parser = Llama3JsonToolParser()
    streamed = "".join(parser.feed(text[i : i + 4]).content for i in range(0, len(text), 4))
    assert streamed + parser.finish().content == text


@pytest.mark.parametrize("name", DELIMITED)
def test_whole_output_splits_into_content_and_calls(name: str) -> None:
    extracted = get_tool_parser(name)().extract("Let me check. " + WRITTEN[name])
    assert extracted.content == "Let me check."
    assert [(call.name, json.loads(call.arguments)) for call in extracted.calls] == EXPECTED


@pytest.mark.parametrize("name", DELIMITED)
def test_streamed_output_gives_the_same_calls_and_no_marker_as_text(name: str) -> None:
    parser = get_tool_parser(name)()
    text = "Hi " + WRITTEN[name] + " bye"
    pieces = [parser.feed(text[i : i + 3]) for i in range(0, len(text), 3)]
    content = "".join(piece.content for piece in pieces) + parser.finish().content
    assert content == "Hi  bye" and "<" not in content
    assert [(call.name, json.loads(call.arguments)) for p in pieces for call in p.calls] == EXPECTED


@pytest.mark.parametrize("name", WRITTEN)
def test_the_grammar_takes_the_familys_calls_and_refuses_a_schema_violation(name: str, ll_tokenizer) -> None:
    grammar = get_tool_parser(name).grammar(TOOLS, parallel=True)
    assert not llguidance.LLMatcher.validate_grammar_with_warnings(grammar, ll_tokenizer)[0]
    matcher = llguidance.LLMatcher(ll_tokenizer, grammar)
    assert matcher.consume_tokens(ll_tokenizer.tokenize_str(WRITTEN[name])) and matcher.is_accepting()
    refused = llguidance.LLMatcher(ll_tokenizer, grammar)
    assert not refused.consume_tokens(ll_tokenizer.tokenize_str(WRITTEN[name].replace('"f"', '"k"')))
    single = llguidance.LLMatcher(ll_tokenizer, get_tool_parser(name).grammar(TOOLS, parallel=False))
    assert not single.consume_tokens(ll_tokenizer.tokenize_str(WRITTEN[name]))  # two calls where one may be


def test_a_malformed_deepseek_block_stays_text() -> None:
    text = "<｜tool▁call▁begin｜>function<｜tool▁sep｜>f\nno fence<｜tool▁call▁end｜>"
    extracted = DeepSeekV3ToolParser().extract(text)
    assert extracted.calls == [] and extracted.content == text

