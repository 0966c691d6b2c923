"""The default step token budget (max_num_batched_tokens when none is given), chosen
from step times measured on the device at start-up: the Sarathi-Serve trade-off.

Every step runs the running decodes together with a chunk of some waiting prompt, so
the step's token budget bounds how long the decodes wait between two tokens. Larger
chunks prefill faster; past the point where the device's GEMMs are saturated they
only lengthen the inter-token gap. Sarathi-Serve sets its strict inter-token latency
target at 5x the time of a one-request decode step and takes the largest chunk whose
step stays under it; this does the same with power-of-two chunks up to a ceiling
(vLLM's online default).

Two figures come out. The prefill chunk is the largest measured chunk within the
target: the most prompt tokens a step computes beside running decodes. The step token
budget (max_num_batched_tokens) is that chunk raised to a floor where every running
sequence can decode in one step (max_num_seqs). On a slow device (a CPU, where a
256-token step takes 6 to 7 one-token steps) the chunk falls below that floor: the
budget alone would let a step with a long prompt run 256 prompt tokens while the
decodes wait for it; the chunk keeps such steps within the target.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

#: The largest default budget: vLLM's max_num_batched_tokens for online serving.
DEFAULT_CEILING = 2048
#: The inter-token latency target, as a multiple of a one-request decode step
#: (Sarathi-Serve's strict P99 TBT SLO).
SLO_DECODE_STEPS = 5.0
#: One-token steps timed (the best counts).
DECODE_REPEATS = 3


@dataclass(frozen=True)
class TokenBudget:
    """The chosen budget and chunk and the measurements they came from."""

    #: The step token budget (max_num_batched_tokens): at least the floor.
    tokens: int
    #: Prompt tokens a step computes beside running decodes (at most `tokens`).
    prefill_chunk: int
    #: Seconds of a one-token step (one decoding request).
    decode_seconds: float
    #: The step time the budget keeps under.
    target_seconds: float
    #: Seconds per step at each budget measured, in the order measured.
    measured: dict[int, float]

    def describe(self) -> str:
        """One log line: the budget, the target and the step times behind it."""
        steps = ", ".join(f"{n}: {s * 1e3:.0f} ms" for n, s in self.measured.items())
        return (
            f"max_num_batched_tokens={self.tokens}, prefill chunk {self.prefill_chunk} (decode step {self.decode_seconds * 1e3:.0f} ms, "
            f"target {self.target_seconds * 1e3:.0f} ms; steps {steps})"
        )


def candidate_chunks(ceiling: int) -> list[int]:
    """Chunks the search may measure, ascending: powers of two below `ceiling`, then
    `ceiling` itself."""
    chunks = [1 << k for k in range(ceiling.bit_length()) if 1 << k < ceiling]
    return [*chunks, ceiling]


def choose_token_budget(
    step_seconds: Callable[[int], float],
    floor: int,
    ceiling: int = DEFAULT_CEILING,
    slo_decode_steps: float = SLO_DECODE_STEPS,
) -> TokenBudget:
    """The largest candidate chunk whose measured step (`step_seconds(tokens)`) stays
    within `slo_decode_steps` one-token steps (a one-token chunk when none does), and
    the budget: that chunk raised to `floor`. The decode step is the best of
    `DECODE_REPEATS` (the first also warms the device up). The search starts at the
    floor (rounded up to a candidate) and walks up while steps stay within the target,
    or down until one does, so it measures few steps: on a fast device the same ones
    as a search up from the floor, on a slow one the floor and the chunks below it
    down to the first within the target."""
    decode = min(step_seconds(1) for _ in range(DECODE_REPEATS))
    target = slo_decode_steps * decode
    candidates = candidate_chunks(ceiling)
    index = next(i for i, n in enumerate(candidates) if n >= min(max(1, floor), ceiling))
    measured: dict[int, float] = {}

    def within(i: int) -> bool:
        measured[candidates[i]] = step_seconds(candidates[i])
        return measured[candidates[i]] <= target

    if within(index):
        while index + 1 < len(candidates) and within(index + 1):
            index += 1
    else:
        while index > 0 and not within(index - 1):
            index -= 1
        index = max(0, index - 1)
    chunk = candidates[index]
    return TokenBudget(max(chunk, min(floor, ceiling)), chunk, decode, target, measured)
