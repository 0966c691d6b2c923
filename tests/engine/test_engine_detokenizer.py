"""Incremental detokenisation and stop strings, against one-shot decoding."""

from __future__ import annotations

import pytest

from accord.core.engine.detokenizer import IncrementalDetokenizer
from accord.demo.tokenizer import build_demo_tokenizer


@pytest.fixture(scope="module")
def tokenizer():
    return build_demo_tokenizer()


def feed(tokenizer, text: str, prompt: str = "Hello", **kwargs) -> tuple[IncrementalDetokenizer, str | None]:
    """Append `text`'s tokens one at a time after `prompt`'s; returns the detokenizer and
    the stop string hit (if any)."""
    prompt_ids = tokenizer.encode(prompt).ids
    token_ids = list(prompt_ids)
    detok = IncrementalDetokenizer(tokenizer, token_ids, len(prompt_ids), **kwargs)
    for token in tokenizer.encode(text).ids:
        token_ids.append(token)
        stop = detok.update()
        if stop is not None:
            return detok, stop
    return detok, None


@pytest.mark.parametrize("text", [" The quick brown fox.", " héllo wörld ✓ 日本語", "  spaced   out\n\nlines"])
def test_incremental_text_equals_one_shot_decoding(tokenizer, text: str) -> None:
    detok, _ = feed(tokenizer, text)
    assert detok.output_text == tokenizer.decode(tokenizer.encode(text).ids)


def test_stop_string_spanning_tokens_cuts_the_text_before_it(tokenizer) -> None:
    detok, stop = feed(tokenizer, " one two three four", stop=["o thr"])
    assert stop == "o thr"
    assert detok.output_text == " one tw"


def test_stop_string_is_kept_when_asked(tokenizer) -> None:
    detok, stop = feed(tokenizer, " one two three four", stop=["two"], include_stop_str_in_output=True)
    assert stop == "two" and detok.output_text == " one two"


def test_running_text_holds_back_a_possible_stop_string_prefix(tokenizer) -> None:
    detok, stop = feed(tokenizer, " one tw", stop=["two!"])
    assert stop is None
    assert detok.visible_text(finished=False) == " one"
    assert detok.visible_text(finished=True) == " one tw"
