"""llguidance's view of a model's tokenizer, built once per tokenizer (about a second
for a large vocabulary) and shared by the grammar matchers and the server's token
bytes."""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import TYPE_CHECKING

import llguidance

if TYPE_CHECKING:
    from ..model_loader.tokenizer import Tokenizer

_lock = threading.Lock()
_cache: dict[int, tuple[Tokenizer, llguidance.LLTokenizer]] = {}


def ll_tokenizer(tokenizer: Tokenizer, vocab_size: int | None = None) -> llguidance.LLTokenizer:
    """The llguidance tokenizer of `tokenizer` (its tokenizer.json), with its EOS ids."""
    with _lock:
        entry = _cache.get(id(tokenizer))
        if entry is None or entry[0] is not tokenizer:
            built = llguidance.LLTokenizer(
                tokenizer.tokenizer.to_str(), n_vocab=vocab_size, eos_token=list(tokenizer.eos_token_ids) or None
            )
            entry = _cache[id(tokenizer)] = (tokenizer, built)
        return entry[1]


def token_bytes_function(tokenizer: Tokenizer) -> Callable[[int], bytes]:
    """A function giving each token's raw bytes (a token may hold part of a UTF-8
    character, which decoding it alone cannot show)."""
    decode_bytes = ll_tokenizer(tokenizer).decode_bytes
    return lambda token_id: decode_bytes([token_id])

