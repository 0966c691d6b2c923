"""Per-request sampling settings, with vLLM's field names so callers move over unchanged.

Invalid settings raise ValueError with a message naming the field (the server maps
ValueError to HTTP 400). Everything that can be checked without the model is checked
when the object is made; what needs the vocabulary is checked by `verify_vocab`, which
the engine calls before it queues a request, so nothing a kernel would choke on (a
32-bit overflow, an id past the vocabulary) ever reaches a step.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from typing import Any

from .structured_output.params import StructuredOutputsParams
from .thinking import ThinkingMarkers

#: Temperatures below this are greedy (the sample contract's threshold).
GREEDY_TEMPERATURE = 1e-5
#: The sample contract carries top_k as int32.
INT32_MAX = 2**31 - 1
#: Counts and ids travel as int64 tensors.
INT64_MAX = 2**63 - 1
#: vLLM and OpenAI bound each logit bias to [-100, 100].
MAX_LOGIT_BIAS = 100.0


def _is_int(value: Any) -> bool:
    # bool is an int subclass, but `True` as a token id or count is always a client bug.
    return isinstance(value, int) and not isinstance(value, bool)


def check_int(name: str, value: Any, low: int, high: int = INT64_MAX, *, optional: bool = False) -> None:
    """Refuse `value` unless it is an int (not a bool) in [low, high]."""
    if value is None and optional:
        return
    if not _is_int(value) or not low <= value <= high:
        raise ValueError(f"{name} must be an integer in [{low}, {high}], got {value!r}.")


def check_float(name: str, value: Any, low: float, high: float, *, low_open: bool = False) -> None:
    """Refuse `value` unless it is a finite number in [low, high] ((low, high] when `low_open`)."""
    ok = isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)
    ok = ok and (low < value if low_open else low <= value) and value <= high
    if not ok:
        interval = f"{'(' if low_open else '['}{low}, {high}]"
        raise ValueError(f"{name} must be a finite number in {interval}, got {value!r}.")


def check_token_ids(name: str, token_ids: Any, vocab_size: int | None = None) -> None:
    """Refuse anything but integer ids (never bools, never negative), inside the
    vocabulary when its size is given."""
    high = INT64_MAX if vocab_size is None else vocab_size - 1
    for token_id in token_ids:
        if not _is_int(token_id) or not 0 <= token_id <= high:
            where = "" if vocab_size is None else f" (the vocabulary has {vocab_size} tokens)"
            raise ValueError(f"{name} must hold token ids in [0, {high}]{where}, got {token_id!r}.")


@dataclass
class SamplingParams:
    """How to sample one request's outputs: vLLM's `SamplingParams` fields and defaults."""

    n: int = 1
    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0
    repetition_penalty: float = 1.0
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = 0
    min_p: float = 0.0
    seed: int | None = None
    stop: str | list[str] | None = None
    stop_token_ids: list[int] | None = None
    ignore_eos: bool = False
    max_tokens: int | None = 16
    min_tokens: int = 0
    logprobs: int | None = None
    prompt_logprobs: int | None = None
    include_stop_str_in_output: bool = False
    skip_special_tokens: bool = True
    detokenize: bool = True
    #: Token id -> value added to its logit before sampling, in [-100, 100].
    logit_bias: dict[int, float] | None = None
    #: A constraint the output must match (JSON schema, regex, choice, grammar); with
    #: `thinking_markers`, the answer's (the thinking is left free).
    structured_outputs: StructuredOutputsParams | None = None
    #: vLLM's extra_args: settings for engine extensions, such as a KV connector's
    #: `kv_transfer_params`.
    extra_args: dict[str, Any] | None = None
    #: A reasoning model's thinking markers: the engine tells thinking from answer by
    #: them (the server sets them from --reasoning-parser).
    thinking_markers: ThinkingMarkers | None = None
    #: Thinking tokens allowed before the engine forces the end marker and the answer
    #: follows; `max_tokens` then bounds the answer alone (needs `thinking_markers`).
    thinking_token_budget: int | None = None
    #: Tokens whose generation stops the request (the model's EOS ids); filled in by
    #: the engine, not by callers.
    all_stop_token_ids: set[int] = field(default_factory=set, repr=False)

    def __post_init__(self) -> None:
        if isinstance(self.stop, str):
            self.stop = [self.stop]
        self.stop = list(self.stop or [])
        self.stop_token_ids = list(self.stop_token_ids or [])
        if self.logit_bias is not None and not isinstance(self.logit_bias, Mapping):
            raise ValueError(f"logit_bias must map token ids to numbers, got {type(self.logit_bias).__name__}.")
        self.logit_bias = dict(self.logit_bias) if self.logit_bias else None
        self._validate()

    def _validate(self) -> None:
        check_int("n", self.n, 1, 1024)
        check_float("presence_penalty", self.presence_penalty, -2.0, 2.0)
        check_float("frequency_penalty", self.frequency_penalty, -2.0, 2.0)
        check_float("repetition_penalty", self.repetition_penalty, 0.0, math.inf, low_open=True)
        check_float("temperature", self.temperature, 0.0, math.inf)
        check_float("top_p", self.top_p, 0.0, 1.0, low_open=True)
        if not _is_int(self.top_k) or not (self.top_k >= -1) or self.top_k > INT32_MAX:
            raise ValueError(f"top_k must be -1 or 0 (disable), or an integer in [1, {INT32_MAX}], got {self.top_k!r}.")
        check_float("min_p", self.min_p, 0.0, 1.0)
        check_int("seed", self.seed, -(2**63), 2**64 - 1, optional=True)
        check_int("max_tokens", self.max_tokens, 1, optional=True)
        check_int("min_tokens", self.min_tokens, 0)
        if self.max_tokens is not None and self.min_tokens > self.max_tokens:
            raise ValueError(
                f"min_tokens must be less than or equal to max_tokens={self.max_tokens}, got {self.min_tokens}."
            )
        check_int("thinking_token_budget", self.thinking_token_budget, 0, optional=True)
        if self.thinking_token_budget is not None and self.thinking_markers is None:
            raise ValueError("thinking_token_budget needs a reasoning model's thinking markers: serve the model with "
                             "--reasoning-parser (offline: pass thinking_markers).")
        check_int("logprobs", self.logprobs, 0, optional=True)
        check_int("prompt_logprobs", self.prompt_logprobs, 0, optional=True)
        if not all(isinstance(stop, str) and stop for stop in self.stop):  # type: ignore[union-attr]
            raise ValueError("stop strings must be non-empty strings.")
        check_token_ids("stop_token_ids", self.stop_token_ids)
        if self.logit_bias:
            check_token_ids("logit_bias", self.logit_bias)
            for value in self.logit_bias.values():
                check_float("logit_bias values", value, -MAX_LOGIT_BIAS, MAX_LOGIT_BIAS)

    def verify_vocab(self, vocab_size: int) -> None:
        """Refuse ids and counts the model's vocabulary cannot satisfy."""
        check_token_ids("stop_token_ids", self.stop_token_ids, vocab_size)
        if self.thinking_markers is not None:
            markers = self.thinking_markers
            check_token_ids("thinking_markers", (markers.start_id, markers.end_id, *markers.turn_end_ids), vocab_size)
        if self.logit_bias:
            check_token_ids("logit_bias", self.logit_bias, vocab_size)
        for name in ("logprobs", "prompt_logprobs"):
            check_int(name, getattr(self, name), 0, vocab_size, optional=True)

    @property
    def greedy(self) -> bool:
        """Whether tokens are the argmax (temperature ~ 0)."""
        return self.temperature < GREEDY_TEMPERATURE

    @property
    def has_penalties(self) -> bool:
        """Whether any presence, frequency or repetition penalty is active."""
        return self.presence_penalty != 0.0 or self.frequency_penalty != 0.0 or self.repetition_penalty != 1.0

    def for_child(self, index: int, eos_token_ids: set[int]) -> SamplingParams:
        """The settings of the `index`-th of n samples: n=1, and a seed offset by the
        index (as vLLM) so seeded siblings differ but stay reproducible."""
        seed = None if self.seed is None else self.seed + index
        child = replace(self, n=1, seed=seed)
        child.all_stop_token_ids = set(child.stop_token_ids) | (set() if self.ignore_eos else set(eos_token_ids))
        return child
