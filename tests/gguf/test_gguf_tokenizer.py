"""The tokenizer built from SmolLM2's GGUF metadata: the same ids as transformers' GGUF
tokenizer on text, chat markup and unicode; digits one token each (llama.cpp's
`smollm` pre-tokenizer, which transformers' GGUF path does not apply); lossless
decoding; and the special tokens the metadata names."""

from __future__ import annotations

from pathlib import Path

import pytest

from accord.core.model_loader.source import load_tokenizer
from accord.core.model_loader.tokenizer import Tokenizer

TEXTS = (
    "Hello, world! How are you today?",
    "  leading spaces, double  spaces and\nnew\n\nlines\twith a tab",
    "Größe, café, naïve: unicode — and 漢字 and emoji 🙂",
    "<|im_start|>user\nWhat's up?<|im_end|>\n<|im_start|>assistant\n",
    "def f(x):\n    return x ** two  # code",
)


@pytest.fixture(scope="module")
def ours(smollm2_gguf: Path) -> Tokenizer:
    return load_tokenizer(smollm2_gguf)


@pytest.fixture(scope="module")
def theirs(smollm2_gguf: Path):
    transformers = pytest.importorskip("transformers")
    return transformers.AutoTokenizer.from_pretrained(smollm2_gguf.parent, gguf_file=smollm2_gguf.name)


@pytest.mark.slow
@pytest.mark.parametrize("text", TEXTS)
def test_encodes_as_transformers_gguf_tokenizer(text: str, ours: Tokenizer, theirs) -> None:
    assert ours.encode(text) == theirs.encode(text, add_special_tokens=True)


@pytest.mark.parametrize("text", TEXTS)
def test_decoding_gives_the_text_back(text: str, ours: Tokenizer) -> None:
    assert ours.decode(ours.encode(text), skip_special_tokens=False) == text


def test_digits_are_one_token_each(ours: Tokenizer) -> None:
    ids = ours.encode("In 2024, 365 days")
    digits = [ours.decode([i]) for i in ids if ours.decode([i]).strip().isdigit()]
    assert digits == list("2024365")


def test_special_tokens_come_from_the_metadata(ours: Tokenizer) -> None:
    assert ours.eos_token == "<|im_end|>" and ours.bos_token == "<|im_start|>"
    assert ours.eos_token_ids == (ours.tokenizer.token_to_id("<|im_end|>"),)
    assert ours.decode(ours.encode("<|im_start|>hi<|im_end|>")) == "hi"
    assert ours.vocab_size == 49152
