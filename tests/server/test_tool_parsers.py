"""The tool-call parsers by vLLM's names, each against its model family's own format:
calls split from the text whole and streamed (a marker never leaks as text), and the
forcing grammar accepts a call in that format and refuses one breaking the tool's schema,
as llguidance's matcher reads it over the demo tokenizer (with Mistral's control tokens
added as special tokens, as Mistral's tokenizers have them)."""

from __future__ import annotations

import json
from pathlib import Path

import llguidance
import pytest
from tokenizers import AddedToken, Tokenizer

from accord.server.tool_parsers import (
    DeepSeekV3ToolParser,
    HermesToolParser,
    Llama3JsonToolParser,
    MistralToolParser,
    Qwen3XmlToolParser,
    StreamingToolCalls,
    ToolParser,
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
    "mistral": '[TOOL_CALLS]get_weather[ARGS]{"unit":"c"}[TOOL_CALLS]get_weather[ARGS]{"unit":"f"}',
    "qwen3_xml": ("<tool_call>\n<function=get_weather>\n<parameter=unit>\nc\n</parameter>\n</function>\n</tool_call>"
                  "<tool_call>\n<function=get_weather>\n<parameter=unit>\nf\n</parameter>\n</function>\n</tool_call>"),
}
EXPECTED = [("get_weather", {"unit": "c"}), ("get_weather", {"unit": "f"})]
#: Mistral's control tokens, special in its tokenizers (v11 and later have [ARGS]).
MISTRAL_TOKENS = ("[TOOL_CALLS]", "[ARGS]")


@pytest.fixture(scope="module")
def tokenizer(demo_model: Path) -> Tokenizer:
    """The demo tokenizer with Mistral's control tokens added, special as in Mistral's."""
    tokenizer = Tokenizer.from_file(str(demo_model / "tokenizer.json"))
    tokenizer.add_special_tokens([AddedToken(token, special=True) for token in MISTRAL_TOKENS])
    return tokenizer


@pytest.fixture(scope="module")
def ll_tokenizer(tokenizer: Tokenizer) -> llguidance.LLTokenizer:
    return llguidance.LLTokenizer(tokenizer.to_str())


@pytest.fixture(scope="module")
def added_tokens(tokenizer: Tokenizer) -> dict[str, int]:
    return {token.content: token_id for token_id, token in tokenizer.get_added_tokens_decoder().items()}


def streamed(parser: ToolParser, text: str, size: int) -> tuple[str, list[tuple[str, str]], list[StreamingToolCalls]]:
    """`text` fed to `parser` `size` characters at a time: the content, the calls
    assembled from their pieces (name, arguments text), and every piece."""
    pieces = [parser.feed(text[i : i + size]) for i in range(0, len(text), size)] + [parser.finish()]
    calls: dict[int, list[str]] = {}
    for piece in pieces:
        for delta in piece.calls:
            # A call's first piece names it; no later piece does.
            assert (delta.index not in calls) == (delta.name is not None)
            calls.setdefault(delta.index, [delta.name or "", ""])[1] += delta.arguments
    assert sorted(calls) == list(range(len(calls)))
    return "".join(piece.content for piece in pieces), [(name, args) for name, args in calls.values()], pieces


def test_the_parsers_have_vllms_names() -> None:
    assert {"hermes", "qwen", "deepseek_v3", "llama3_json", "mistral", "qwen3_xml", "qwen3_coder"} <= set(
        tool_parser_names())
    assert get_tool_parser("llama3_json") is Llama3JsonToolParser
    assert get_tool_parser("deepseek_v3") is DeepSeekV3ToolParser and get_tool_parser("hermes") is HermesToolParser
    assert get_tool_parser("mistral") is MistralToolParser
    assert get_tool_parser("qwen3_xml") is get_tool_parser("qwen3_coder") is Qwen3XmlToolParser  # one format in vLLM


#: Formats whose calls sit inside text (llama3_json's whole answer is the calls).
DELIMITED = ("hermes", "deepseek_v3", "mistral", "qwen3_xml")
LLAMA3 = '<|python_tag|>{"name": "get_weather", "parameters": {"unit": "c"}}; {"name": "get_weather", "parameters": {"unit": "f"}}'


@pytest.mark.parametrize("text", [LLAMA3, LLAMA3.removeprefix("<|python_tag|>")], ids=["tagged", "bare"])
def test_llama3_json_reads_a_whole_answer_of_calls(text: str) -> None:
    extracted = Llama3JsonToolParser().extract(text)
    assert extracted.content is None
    assert [(call.name, json.loads(call.arguments)) for call in extracted.calls] == EXPECTED
    parser = Llama3JsonToolParser()
    content, calls, pieces = streamed(parser, text, 3)
    assert all(piece.content == "" and piece.calls == [] for piece in pieces[:-1])  # held until the end
    assert content == "" and [(name, json.loads(args)) for name, args in calls] == EXPECTED


@pytest.mark.parametrize("text", ["The weather is fine.", "{not json at all", " <|python_tag|> nothing"])
def test_llama3_json_leaves_other_answers_as_text(text: str) -> None:
    assert Llama3JsonToolParser().extract(text).calls == []
    parser = Llama3JsonToolParser()
    streamed = "".join(parser.feed(text[i : i + 4]).content for i in range(0, len(text), 4))
    assert streamed + parser.finish().content == text


@pytest.mark.parametrize("name", DELIMITED)
def test_whole_output_splits_into_content_and_calls(name: str) -> None:
    extracted = get_tool_parser(name)(TOOLS).extract("Let me check. " + WRITTEN[name])
    assert extracted.content == "Let me check."
    assert [(call.name, json.loads(call.arguments)) for call in extracted.calls] == EXPECTED


#: Text after the calls: Mistral's last call runs to the end of the answer.
AFTER = {"mistral": ""}


@pytest.mark.parametrize("size", [1, 3], ids=["by-character", "in-chunks"])
@pytest.mark.parametrize("name", DELIMITED)
def test_streamed_output_gives_the_same_calls_and_no_marker_as_text(name: str, size: int) -> None:
    after = AFTER.get(name, " bye")
    content, calls, _ = streamed(get_tool_parser(name)(TOOLS), "Hi " + WRITTEN[name] + after, size)
    assert content == "Hi " + after and "<" not in content and "[" not in content
    assert [(name, json.loads(args)) for name, args in calls] == EXPECTED


@pytest.mark.parametrize("name", WRITTEN)
def test_the_grammar_takes_the_familys_calls_and_refuses_a_schema_violation(
    name: str, tokenizer: Tokenizer, ll_tokenizer, added_tokens: dict[str, int]
) -> None:
    def tokens(text: str) -> list[int]:
        return tokenizer.encode(text, add_special_tokens=False).ids

    parser = get_tool_parser(name)(TOOLS, added_tokens)
    grammar = llguidance.LLMatcher.grammar_from_lark(parser.grammar(parallel=True))
    assert not llguidance.LLMatcher.validate_grammar_with_warnings(grammar, ll_tokenizer)[0]
    matcher = llguidance.LLMatcher(ll_tokenizer, grammar)
    assert matcher.consume_tokens(tokens(WRITTEN[name])) and matcher.is_accepting()
    refused = llguidance.LLMatcher(ll_tokenizer, grammar)
    violation = WRITTEN[name].replace('"f"', '"k"').replace("\nf\n", "\nk\n")
    assert not refused.consume_tokens(tokens(violation))
    single = llguidance.LLMatcher(ll_tokenizer, llguidance.LLMatcher.grammar_from_lark(parser.grammar(parallel=False)))
    assert not single.consume_tokens(tokens(WRITTEN[name]))  # two calls where one may be


def test_a_malformed_deepseek_block_stays_text() -> None:
    text = "<｜tool▁call▁begin｜>function<｜tool▁sep｜>f\nno fence<｜tool▁call▁end｜>"
    extracted = DeepSeekV3ToolParser().extract(text)
    assert extracted.calls == [] and extracted.content == text

