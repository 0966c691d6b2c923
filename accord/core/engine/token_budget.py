"""The default step token budget (max_num_batched_tokens when none is given), chosen
from step times measured on the device at start-up: the Sarathi-Serve trade-off.

Every step runs the running decodes together with a chunk of some waiting prompt, so
the step's token budget bounds how long the decodes wait between two tokens. Larger
chunks prefill faster; past the point where the device's GEMMs are saturated they
only lengthen the inter-token gap. Sarathi-Serve sets its strict inter-token latency
target at 5x the time of a one-request decode step and takes the largest chunk whose
step stays under it; this does the same with power-of-two budgets between a floor
(every running sequence can decode in one step) and a ceiling (vLLM's online default).
Offline generation (`LLM`) takes a fixed throughput budget instead (OFFLINE_BUDGET).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

#: The largest default budget: vLLM's max_num_batched_tokens for online serving.
DEFAULT_CEILING = 2048
#: The default budget of offline generation (`LLM`), which is never measured: a batch
#: has no inter-token target, only its total time, and larger steps spread each weight
#: read over more tokens. vLLM-CPU's max_num_batched_tokens (4096). On a 2-core Sapphire
#: Rapids the measured online choice sat at its floor (256 tokens: an 85 ms step against a
#: 67 ms target), a fraction of what the GEMMs amortise at 4096.
OFFLINE_BUDGET = 4096
#: The inter-token latency target, as a multiple of a one-request decode step
#: (Sarathi-Serve's strict P99 TBT SLO).
SLO_DECODE_STEPS = 5.0
#: One-token steps timed (the best counts).
DECODE_REPEATS = 3


@dataclass(frozen=True)
class TokenBudget:
    """The chosen budget and the measurements it came from."""

    tokens: int
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
            f"max_num_batched_tokens={self.tokens} (decode step {self.decode_seconds * 1e3:.0f} ms, "
            f"target {self.target_seconds * 1e3:.0f} ms; steps {steps})"
        )


def candidate_budgets(floor: int, ceiling: int) -> list[int]:
    """Budgets tried, ascending: `floor` rounded up to a power of two, doubling up to
    `ceiling` (which is tried itself when it is not a power of two)."""
    floor = max(1, min(floor, ceiling))
    budget = 1 << (floor - 1).bit_length()
    budgets = []
    while budget < ceiling:
        budgets.append(budget)
        budget *= 2
    return [*budgets, ceiling]


def choose_token_budget(
    step_seconds: Callable[[int], float],
    floor: int,
    ceiling: int = DEFAULT_CEILING,
    slo_decode_steps: float = SLO_DECODE_STEPS,
) -> TokenBudget:
    """The largest candidate budget whose measured step (`step_seconds(tokens)`) stays
    within `slo_decode_steps` one-token steps; the smallest candidate when none does.
    The decode step is the best of `DECODE_REPEATS` (the first also warms the device
    up); budgets are measured once each, in ascending order, stopping at the first one
    over the target, so the search costs about two target step times."""
    decode = min(step_seconds(1) for _ in range(DECODE_REPEATS))
    target = slo_decode_steps * decode
    candidates = candidate_budgets(floor, ceiling)
    chosen, measured = candidates[0], {}
    for tokens in candidates:
        measured[tokens] = step_seconds(tokens)
        if measured[tokens] > target:
            break
        chosen = tokens
    return TokenBudget(chosen, decode, target, measured)
