"""Structured output: constraining what a request may generate to a JSON schema, a
regular expression, a list of choices or a grammar, through llguidance.

The design is vLLM v1's: grammar matchers live on the scheduler side (the engine) and
advance as tokens are accepted; each step the matchers of the sequences that sample
fill one token bitmask, which travels with the scheduler output to the sampler and
masks the logits before the `sample` contract, the same on every backend.
"""

from .manager import GrammarBitmask, StructuredOutputManager, apply_token_bitmask
from .params import StructuredOutputsParams
from .tokenizer import token_bytes_function

__all__ = ["GrammarBitmask", "StructuredOutputManager", "StructuredOutputsParams", "apply_token_bitmask", "token_bytes_function"]
