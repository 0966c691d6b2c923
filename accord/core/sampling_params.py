"""Per-request sampling settings, with vLLM's field names so callers move over unchanged.

Invalid settings raise ValueError with a message naming the field (the server maps
ValueError to HTTP 400).
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace

#: Temperatures below this are greedy (the sample contract's threshold).
GREEDY_TEMPERATURE = 1e-5


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
    #: Tokens whose generation stops the request (the model's EOS ids); filled in by
    #: the engine, not by callers.
    all_stop_token_ids: set[int] = field(default_factory=set, repr=False)

    def __post_init__(self) -> None:
        if isinstance(self.stop, str):
            self.stop = [self.stop]
        self.stop = list(self.stop or [])
        self.stop_token_ids = list(self.stop_token_ids or [])
        self._validate()

    def _validate(self) -> None:
        checks = (
            (self.n >= 1, f"n must be at least 1, got {self.n}."),
            (
                -2.0 <= self.presence_penalty <= 2.0,
                f"presence_penalty must be in [-2, 2], got {self.presence_penalty}.",
            ),
            (
                -2.0 <= self.frequency_penalty <= 2.0,
                f"frequency_penalty must be in [-2, 2], got {self.frequency_penalty}.",
            ),
            (
                self.repetition_penalty > 0.0,
                f"repetition_penalty must be greater than zero, got {self.repetition_penalty}.",
            ),
            (self.temperature >= 0.0, f"temperature must be non-negative, got {self.temperature}."),
            (0.0 < self.top_p <= 1.0, f"top_p must be in (0, 1], got {self.top_p}."),
            (self.top_k >= -1, f"top_k must be -1 or 0 (disable), or at least 1, got {self.top_k}."),
            (0.0 <= self.min_p <= 1.0, f"min_p must be in [0, 1], got {self.min_p}."),
            (self.max_tokens is None or self.max_tokens >= 1, f"max_tokens must be at least 1, got {self.max_tokens}."),
            (self.min_tokens >= 0, f"min_tokens must be greater than or equal to 0, got {self.min_tokens}."),
            (
                self.max_tokens is None or self.min_tokens <= self.max_tokens,
                f"min_tokens must be less than or equal to max_tokens={self.max_tokens}, got {self.min_tokens}.",
            ),
            (self.logprobs is None or self.logprobs >= 0, f"logprobs must be non-negative, got {self.logprobs}."),
            (
                self.prompt_logprobs is None or self.prompt_logprobs >= 0,
                f"prompt_logprobs must be non-negative, got {self.prompt_logprobs}.",
            ),
            (all(self.stop), "stop strings must be non-empty."),
        )
        for ok, message in checks:
            if not ok:
                raise ValueError(message)

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
