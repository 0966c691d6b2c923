"""The tokenizer a GGUF file describes (vocabulary, merges, token types, special token
ids, chat template), built as a `tokenizers` byte-level BPE tokenizer, the same kind
of object tokenizer.json gives, and wrapped in accord's Tokenizer.

The text split before BPE depends on the vocabulary (`tokenizer.ggml.pre`); the splits
are those llama.cpp applies for each name. A name not listed here is refused rather
than tokenised with the wrong split.
"""

from __future__ import annotations

from pathlib import Path
from typing import Callable

import gguf
from tokenizers import AddedToken, Regex, decoders, models, pre_tokenizers, processors
from tokenizers import Tokenizer as BackendTokenizer

from ..tokenizer import Tokenizer
from .reader import GgufError, GgufFile, open_gguf

_LLAMA3_SPLIT = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
)
_QWEN2_SPLIT = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
)


def _gpt2() -> pre_tokenizers.PreTokenizer:
    return pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)


def _digits_then_gpt2() -> pre_tokenizers.PreTokenizer:
    return pre_tokenizers.Sequence([pre_tokenizers.Digits(individual_digits=True), _gpt2()])


def _split(pattern: str) -> Callable[[], pre_tokenizers.PreTokenizer]:
    def build() -> pre_tokenizers.PreTokenizer:
        return pre_tokenizers.Sequence(
            [pre_tokenizers.Split(Regex(pattern), behavior="isolated"), pre_tokenizers.ByteLevel(use_regex=False)]
        )

    return build


#: `tokenizer.ggml.pre` -> (pre-tokenizer, whether a whole pre-token found in the
#: vocabulary skips the merges, as llama.cpp does for Llama 3).
PRE_TOKENIZERS: dict[str, tuple[Callable[[], pre_tokenizers.PreTokenizer], bool]] = {
    "default": (_gpt2, False),
    "gpt-2": (_gpt2, False),
    "smollm": (_digits_then_gpt2, False),
    "llama-bpe": (_split(_LLAMA3_SPLIT), True),
    "llama3": (_split(_LLAMA3_SPLIT), True),
    "qwen2": (_split(_QWEN2_SPLIT), False),
    "deepseek-r1-qwen": (_split(_QWEN2_SPLIT), False),
}
TOKENIZER_MODELS = ("gpt2",)


def load_gguf_tokenizer(path: str | Path) -> Tokenizer:
    """accord's Tokenizer for the GGUF file at `path`."""
    file = open_gguf(path)
    backend = build_backend_tokenizer(file)
    tokens = file.get("tokenizer.ggml.tokens")
    bos_id, eos_id = file.get("tokenizer.ggml.bos_token_id", None), file.get("tokenizer.ggml.eos_token_id", None)
    extra_eos = [file.get(f"tokenizer.ggml.{key}", None) for key in ("eot_token_id", "eom_token_id")]
    return Tokenizer(
        backend,
        chat_template=file.get("tokenizer.chat_template", None),
        bos_token=None if bos_id is None else tokens[bos_id],
        eos_token=None if eos_id is None else tokens[eos_id],
        extra_eos_token_ids=[i for i in extra_eos if i is not None],
    )


def build_backend_tokenizer(file: GgufFile) -> BackendTokenizer:
    """The byte-level BPE `tokenizers.Tokenizer` of the file's vocabulary."""
    kind = file.get("tokenizer.ggml.model", None)
    if kind not in TOKENIZER_MODELS:
        raise GgufError(
            f"{file.path}: GGUF tokenizer model {kind!r} is not supported; supported: {list(TOKENIZER_MODELS)}"
        )
    pre = file.get("tokenizer.ggml.pre", "default")
    if pre not in PRE_TOKENIZERS:
        raise GgufError(
            f"{file.path}: GGUF pre-tokenizer {pre!r} is not supported; supported: {sorted(PRE_TOKENIZERS)}"
        )
    build_pre_tokenizer, ignore_merges = PRE_TOKENIZERS[pre]
    tokens: list[str] = file.get("tokenizer.ggml.tokens")
    merges = [tuple(merge.split(" ", 1)) for merge in file.get("tokenizer.ggml.merges")]
    vocab = {token: index for index, token in enumerate(tokens)}
    tokenizer = BackendTokenizer(models.BPE(vocab, merges, fuse_unk=False, ignore_merges=ignore_merges))
    tokenizer.pre_tokenizer = build_pre_tokenizer()
    tokenizer.decoder = decoders.ByteLevel()
    # Control tokens (<|im_start|>) are special; user-defined ones (<think>) are matched
    # whole in text but kept when decoding, as llama.cpp treats them.
    types = file.get("tokenizer.ggml.token_type", [])
    tokenizer.add_special_tokens(_tokens_of_type(tokens, types, gguf.TokenType.CONTROL, special=True))
    tokenizer.add_tokens(_tokens_of_type(tokens, types, gguf.TokenType.USER_DEFINED, special=False))
    if file.get("tokenizer.ggml.add_bos_token", False):
        bos = tokens[file.get("tokenizer.ggml.bos_token_id")]
        tokenizer.post_processor = processors.TemplateProcessing(
            single=f"{bos} $A", pair=f"{bos} $A {bos} $B", special_tokens=[(bos, vocab[bos])]
        )
    return tokenizer


def _tokens_of_type(tokens: list[str], types: list[int], kind: int, special: bool) -> list[AddedToken]:
    return [AddedToken(t, special=special, normalized=False) for t, k in zip(tokens, types) if k == kind]
