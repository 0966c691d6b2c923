"""Turns StructuredOutputsParams into an llguidance grammar and checks it compiles."""

from __future__ import annotations

import json

import llguidance
from llguidance.gbnf_to_lark import any_to_lark

from .params import COMPACT_JSON, StructuredOutputsParams


def lark_literal(text: str) -> str:
    """`text` as a Lark string literal (JSON string escapes are Lark's too)."""
    return json.dumps(text, ensure_ascii=False)


def grammar_source(params: StructuredOutputsParams) -> str:
    """The llguidance grammar (its JSON serialisation) that `params` describe."""
    if params.json is not None or params.json_object:
        return llguidance.LLMatcher.grammar_from_json_schema(params.schema(), defaults=COMPACT_JSON)
    if params.regex is not None:
        return llguidance.LLMatcher.grammar_from_regex(params.regex)
    if params.choice is not None:
        return llguidance.LLMatcher.grammar_from_lark("start: " + " | ".join(map(lark_literal, params.choice)))
    assert params.grammar is not None
    # Lark as given; GBNF (llama.cpp's and vLLM's EBNF form) converted to it.
    return llguidance.LLMatcher.grammar_from_lark(any_to_lark(params.grammar))
