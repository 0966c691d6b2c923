"""The deploy smoke's model-level half: a fixed prompt set shaped by the deploy config
(mixed lengths, shared prefixes, prompts long enough to need chunked prefill), and
the comparison of two backends' greedy token streams and logprobs."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

from ..core.lora.request import LoRARequest
from ..core.outputs import CompletionOutput

#: Plain text the prompts are cut from; any tokenizer turns it into many tokens.
PASSAGE = (
    "The release engineer pins the image, reads the deploy config, and runs the gate. "
    "Every kernel call crosses a typed contract; the reference backend is the golden. "
    "Prefix caching shares blocks between requests, and long prompts arrive in chunks. "
)


@dataclass(frozen=True)
class Prompt:
    """One prompt of the set, as token ids, with what it exercises, and the LoRA
    adapter it runs under (None: the base model)."""

    label: str
    token_ids: tuple[int, ...]
    adapter: LoRARequest | None = None


def prompt_set(passage_ids: Sequence[int], max_num_batched_tokens: int, room: int) -> list[Prompt]:
    """Prompts cut from `passage_ids` repeated: short ones, two sharing a long prefix,
    and one longer than a step's token budget (so it prefills in chunks). `room` is the
    longest prompt the model's context holds with the tokens to generate after it."""
    if not passage_ids:
        raise ValueError("the passage encoded to no tokens")
    if room < 1:
        raise ValueError("max_model_len leaves no room for a prompt; raise it or lower gate.max_tokens")

    def cut(length: int) -> tuple[int, ...]:
        length = max(1, min(length, room))
        repeats = -(-length // len(passage_ids))
        return tuple((list(passage_ids) * repeats)[:length])

    shared = cut(room // 2)
    return [
        Prompt("short", cut(3)),
        Prompt("medium", cut(24)),
        Prompt("shared prefix a", shared[:-1] + (passage_ids[0],)),
        Prompt("shared prefix b", shared[:-1] + (passage_ids[-1],)),
        Prompt("chunked prefill", cut(2 * max_num_batched_tokens + 1)),
    ]


@dataclass(frozen=True)
class StreamComparison:
    """How one backend's greedy streams match the reference's: the share of positions
    with the same token, the largest |logprob difference| over tokens both chose before
    the streams part, and where the first stream parts (prompt label, position)."""

    agreement: float
    max_logprob_diff: float
    first_divergence: tuple[str, int] | None
    tokens_compared: int


def _chosen_logprob(output: CompletionOutput, position: int) -> float | None:
    if output.logprobs is None or position >= len(output.logprobs):
        return None
    entry = output.logprobs[position].get(output.token_ids[position])
    return None if entry is None else entry.logprob


def compare_streams(
    prompts: Sequence[Prompt], got: Sequence[CompletionOutput], want: Sequence[CompletionOutput]
) -> StreamComparison:
    """Compare position by position; a stream shorter than the other counts its
    missing positions as disagreements."""
    agreed = compared = 0
    worst_diff = 0.0
    first: tuple[str, int] | None = None
    for prompt, a, b in zip(prompts, got, want):
        length, common = max(len(a.token_ids), len(b.token_ids)), min(len(a.token_ids), len(b.token_ids))
        compared += length
        ending = None if length == common else common
        parted = next((i for i in range(common) if a.token_ids[i] != b.token_ids[i]), ending)
        agreed += sum(1 for x, y in zip(a.token_ids, b.token_ids) if x == y)
        if parted is not None and first is None:
            first = (prompt.label, parted)
        for position in range(length if parted is None else parted):
            pair = (_chosen_logprob(a, position), _chosen_logprob(b, position))
            if None not in pair:
                worst_diff = max(worst_diff, abs(pair[0] - pair[1]))  # type: ignore[operator]
    agreement = agreed / compared if compared else 1.0
    return StreamComparison(agreement, worst_diff, first, compared)
