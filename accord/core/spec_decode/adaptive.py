"""Adaptive speculation: how many of each request's drafts a step checks, chosen from
measured acceptance and step times so the expected tokens per second is highest.

The model: a request whose drafts are each accepted with probability p (the one before
accepted) emits 1 + p + p^2 + ... + p^k tokens when k drafts are checked; a step of B
decodes costs the plain step's seconds plus a measured cost per checked draft token.
Draft j of a request adds p^j tokens and one draft's cost, so the drafts worth checking
are taken best first while each still raises tokens per second (`choose_draft_lengths`).
At a large batch on a CPU a step is compute bound and a draft costs as much as a decode,
so none pays; at batch 1 a step is bound by reading the weights and most do.

`AdaptiveDrafting` keeps the measurements: per request, an exponential moving average of
its accepted drafts over its checked draft positions; per batch size bucket (powers of
two), moving averages of a plain decode step's seconds and of a verify step's extra
seconds per draft token. A bucket without both measures first (a plain step, then one
with every proposal), and each is measured again after `REFRESH_STEPS` steps without
it, so a changing load or acceptance is followed.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

#: Weight of a new step-time sample in its moving average.
STEP_TIME_WEIGHT = 0.2
#: Weight the acceptance counts of earlier steps keep at each new check.
ACCEPTANCE_DECAY = 0.8
#: Steps of a bucket after which a plain step, or a step with every proposal, is measured again.
REFRESH_STEPS = 32


@dataclass(frozen=True)
class StepCosts:
    """A batch size's measured step times: a plain decode step's seconds, and the extra
    seconds each checked draft token adds to a step."""

    plain_seconds: float
    seconds_per_draft: float


def choose_draft_lengths(acceptance: Sequence[float], proposal_lengths: Sequence[int], costs: StepCosts) -> list[int]:
    """How many drafts each decode of a step should check (at most its proposal's length)
    to maximise expected tokens per second, given each one's per-draft acceptance
    probability and the step's costs; all zeros is the plain step."""
    tokens = float(len(acceptance))  # each decode emits one token whatever its drafts
    seconds = costs.plain_seconds
    # Draft j of a request adds p^j tokens; p^j falls with j, so best-first order takes
    # each request's drafts in their order, and once one does not raise the rate
    # (tokens + g) / (seconds + c) > tokens / seconds, no smaller one does.
    gains = sorted(
        ((p**j, i) for i, (p, length) in enumerate(zip(acceptance, proposal_lengths)) for j in range(1, length + 1)),
        key=lambda item: item[0],
        reverse=True,
    )
    lengths = [0] * len(acceptance)
    for gain, i in gains:
        if gain * seconds <= tokens * costs.seconds_per_draft:
            break
        tokens += gain
        seconds += costs.seconds_per_draft
        lengths[i] += 1
    return lengths


def acceptance_trials(drafted: int, accepted: int) -> int:
    """Draft positions a check tested: the accepted ones and the first rejected one (the
    drafts after a rejection are never tested, so they say nothing of p)."""
    return accepted + (accepted < drafted)


@dataclass
class _Bucket:
    """Moving averages of one batch size bucket's step times (None: not measured yet)."""

    plain_seconds: float | None = None
    seconds_per_draft: float | None = None
    steps_since_plain: int = 0
    steps_since_verify: int = 0


class AdaptiveDrafting:
    """The measurements adaptive speculation decides from, and its per-step choice;
    the scheduler reports checks and step times and asks how many drafts to check."""

    def __init__(self) -> None:
        # Per request, and over all requests (a new request's prior): decayed sums of
        # accepted drafts and of tested draft positions.
        self._accepted: dict[str, float] = {}
        self._trials: dict[str, float] = {}
        self._all_accepted = 0.0
        self._all_trials = 0.0
        self._buckets: dict[int, _Bucket] = {}

    def acceptance(self, req_id: str) -> float:
        """The request's estimated per-draft acceptance probability: its own average,
        else all requests', else 1 (unmeasured: check its drafts, which measures it)."""
        trials = self._trials.get(req_id, 0.0)
        if trials > 0:
            return self._accepted[req_id] / trials
        return self._all_accepted / self._all_trials if self._all_trials > 0 else 1.0

    def observe_check(self, req_id: str, drafted: int, accepted: int) -> None:
        """A step checked `drafted` drafts of the request and accepted the first `accepted`."""
        trials = acceptance_trials(drafted, accepted)
        self._accepted[req_id] = ACCEPTANCE_DECAY * self._accepted.get(req_id, 0.0) + accepted
        self._trials[req_id] = ACCEPTANCE_DECAY * self._trials.get(req_id, 0.0) + trials
        self._all_accepted = ACCEPTANCE_DECAY * self._all_accepted + accepted
        self._all_trials = ACCEPTANCE_DECAY * self._all_trials + trials

    def forget(self, req_id: str) -> None:
        """The request finished: drop its average."""
        self._accepted.pop(req_id, None)
        self._trials.pop(req_id, None)

    def observe_step(self, num_decodes: int, num_drafts: int, seconds: float) -> None:
        """A step of `num_decodes` decodes only, checking `num_drafts` drafts in all, took `seconds`."""
        bucket = self._bucket(num_decodes)
        if num_drafts == 0:
            bucket.plain_seconds = _average(bucket.plain_seconds, seconds)
            bucket.steps_since_plain = 0
            bucket.steps_since_verify += 1
            return
        bucket.steps_since_plain += 1
        if bucket.plain_seconds is None:
            return  # the extra cost is measured against a plain step
        # Noise can make a verify step look faster than a plain one: a draft costs >= 0.
        extra = max(0.0, seconds - bucket.plain_seconds) / num_drafts
        bucket.seconds_per_draft = _average(bucket.seconds_per_draft, extra)
        bucket.steps_since_verify = 0

    def draft_lengths(self, proposals: Mapping[str, int]) -> dict[str, int]:
        """How many drafts each decode of the step checks, by request id, given every
        decode's proposal length (0 for a decode without drafts)."""
        bucket = self._bucket(len(proposals))
        if bucket.plain_seconds is None or bucket.steps_since_plain >= REFRESH_STEPS:
            return dict.fromkeys(proposals, 0)  # measure a plain step
        if bucket.seconds_per_draft is None or bucket.steps_since_verify >= REFRESH_STEPS:
            return dict(proposals)  # measure a step checking every proposal
        req_ids = list(proposals)
        lengths = choose_draft_lengths(
            [self.acceptance(req_id) for req_id in req_ids],
            [proposals[req_id] for req_id in req_ids],
            StepCosts(bucket.plain_seconds, bucket.seconds_per_draft),
        )
        return dict(zip(req_ids, lengths))

    def _bucket(self, num_decodes: int) -> _Bucket:
        # Powers of two: a step's cost changes little between neighbouring batch sizes.
        return self._buckets.setdefault(max(0, num_decodes - 1).bit_length(), _Bucket())


def _average(average: float | None, sample: float) -> float:
    return sample if average is None else (1 - STEP_TIME_WEIGHT) * average + STEP_TIME_WEIGHT * sample
