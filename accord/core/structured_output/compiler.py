"""Checking a request's constraint into a grammar, against llguidance's view of the
tokenizer: the part of structured output that needs no scheduler state, so it can run
anywhere (the engine compiles before it hands a request to the scheduler)."""

from __future__ import annotations

import threading
from typing import TYPE_CHECKING

import llguidance

from .grammar import grammar_source
from .params import StructuredOutputsParams
from .tokenizer import ll_tokenizer

if TYPE_CHECKING:
    from ..model_loader.tokenizer import Tokenizer


class GrammarCompiler:
    """Compiles constraints for one tokenizer; llguidance's tokenizer is built on first
    use (about a second for a large vocabulary, so servers that never constrain never
    pay it), once, whichever thread asks first."""

    def __init__(self, tokenizer: Tokenizer, vocab_size: int) -> None:
        self._tokenizer = tokenizer
        self._vocab_size = vocab_size
        self._ll_tokenizer: llguidance.LLTokenizer | None = None
        self._lock = threading.Lock()

    @property
    def ll_tokenizer(self) -> llguidance.LLTokenizer:
        """llguidance's view of the tokenizer (built on first use)."""
        with self._lock:
            if self._ll_tokenizer is None:
                self._ll_tokenizer = ll_tokenizer(self._tokenizer, self._vocab_size)
            return self._ll_tokenizer

    def compile(self, params: StructuredOutputsParams) -> str:
        """The checked grammar for `params`; ValueError naming the problem when it
        does not compile (a bad schema, regex or grammar)."""
        try:
            source = grammar_source(params)
        except Exception as error:  # llguidance reports bad input with several exception types
            raise ValueError(f"the structured output constraint is invalid: {error}") from None
        is_error, messages = llguidance.LLMatcher.validate_grammar_with_warnings(source, self.ll_tokenizer)
        if is_error:
            raise ValueError(f"the structured output constraint is invalid: {messages[0]}")
        return source
