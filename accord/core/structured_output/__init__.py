"""Structured output: constraining what a request may generate to a JSON schema, a
regular expression, a list of choices or a grammar, through llguidance.

The design is vLLM v1's: the engine compiles a request's grammar (GrammarCompiler);
its matcher lives with the scheduler and advances as tokens are accepted; each step
the matchers of the requests that sample
fill one token bitmask, which travels with the scheduler output to the sampler and
masks the logits before the `sample` contract, the same on every backend.
"""

from .compiler import GrammarCompiler
from .manager import GrammarBitmask, StructuredOutputManager, apply_token_bitmask
from .params import StructuredOutputsParams
from .tokenizer import token_bytes_function

__all__ = [
    "GrammarBitmask",
    "GrammarCompiler",
    "StructuredOutputManager",
    "StructuredOutputsParams",
    "apply_token_bitmask",
    "token_bytes_function",
]
