"""A reasoning model's thinking stretch, as the engine sees it: the marker tokens that
open and close it, and one request's progress through it (how many thinking tokens so
far, whether the answer has begun, and the token the thinking budget forces).

The thinking state at the start of the output follows from the prompt, as the chat
template leaves it (vLLM's `prompt_is_reasoning_end`): a prompt whose last marker is the
end marker (Qwen3 with `enable_thinking=False` writes `<think>\\n\\n</think>`) is
answered at once; any other prompt (DeepSeek-R1's, ending in `<think>\\n`, or Qwen3's,
after which the model writes `<think>` itself) is followed by thinking. Only the markers
of the turn being answered count: a template that writes an earlier turn's thinking
into the prompt (Qwen3's, within a tool-calling loop) closes that turn with an
end-of-turn token, and markers before it say nothing about the new output. The thinking
stretch is every output token before the first end marker, and ends for good there.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field


@dataclass(frozen=True)
class ThinkingMarkers:
    """The token ids that open and close a model family's thinking (`<think>`, `</think>`)."""

    start_id: int
    end_id: int
    #: Tokens that end a turn (the model's end-of-sequence ids: `<|im_end|>`,
    #: `<｜end▁of▁sentence｜>`); markers before the prompt's last one are an earlier turn's.
    turn_end_ids: frozenset[int] = frozenset()

    def thinks_after(self, prompt_token_ids: Sequence[int]) -> bool:
        """Whether the output of this prompt begins inside the thinking: the last marker
        of its last turn is not the end marker (a turn without one thinks)."""
        for token in reversed(prompt_token_ids):
            if token == self.end_id:
                return False
            if token == self.start_id or token in self.turn_end_ids:
                return True
        return True


@dataclass
class ThinkingProgress:
    """One request's progress through its thinking, fed the output tokens as they come
    (`observe` takes the whole output so far and reads only what it has not seen)."""

    markers: ThinkingMarkers
    #: Thinking tokens allowed before the end marker is forced (None: no limit).
    budget: int | None
    thinking: bool
    #: Output tokens before the end marker (those the thinking took).
    num_thinking_tokens: int = 0
    _num_seen: int = field(default=0, repr=False)
    #: Whether the output began inside the thinking (else it is all answer).
    began_thinking: bool = field(init=False)

    def __post_init__(self) -> None:
        self.began_thinking = self.thinking

    @classmethod
    def after_prompt(
        cls, markers: ThinkingMarkers, prompt_token_ids: Sequence[int], budget: int | None = None
    ) -> ThinkingProgress:
        """The progress at the start of the output of `prompt_token_ids`."""
        return cls(markers, budget, thinking=markers.thinks_after(prompt_token_ids))

    def observe(self, output_token_ids: Sequence[int]) -> None:
        """Take the output tokens not seen yet."""
        for token in output_token_ids[self._num_seen :]:
            if not self.thinking:
                break
            if token == self.markers.end_id:
                self.thinking = False
            else:
                self.num_thinking_tokens += 1
        self._num_seen = len(output_token_ids)

    @property
    def forced_token(self) -> int | None:
        """The token the next step must sample: the end marker once the budget is spent."""
        if self.thinking and self.budget is not None and self.num_thinking_tokens >= self.budget:
            return self.markers.end_id
        return None

    @property
    def answer_start(self) -> int | None:
        """The output position where the answer begins: after the thinking tokens and
        their end marker, bounded by the budget while the thinking goes on (the end
        marker comes at the budget at the latest); None while thinking without a budget."""
        if not self.thinking:
            return self.num_thinking_tokens + 1 if self.began_thinking else 0
        return None if self.budget is None else self.budget + 1


def count_reasoning_tokens(
    markers: ThinkingMarkers, prompt_token_ids: Sequence[int], output_token_ids: Sequence[int]
) -> int:
    """How many of an output's tokens are thinking (`usage.completion_tokens_details.reasoning_tokens`)."""
    progress = ThinkingProgress.after_prompt(markers, prompt_token_ids)
    progress.observe(output_token_ids)
    return progress.num_thinking_tokens


def forced_thinking_token(
    markers: ThinkingMarkers | None,
    budget: int | None,
    prompt_token_ids: Sequence[int],
    output_token_ids: Sequence[int],
) -> int | None:
    """The end marker when the next token must be it (the thinking has spent its budget
    and not ended), else None. Stateless, for the sampler: the cheap tests come first,
    so a request only pays the prompt's scan on the step that forces."""
    if markers is None or budget is None or len(output_token_ids) < budget:
        return None
    if markers.end_id in output_token_ids or not markers.thinks_after(prompt_token_ids):
        return None
    return markers.end_id
