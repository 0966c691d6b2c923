"""Adaptive speculation: how many of each request's drafts a step checks, chosen from
measured acceptance and step times so the expected tokens per second is highest.

The model: a request whose drafts are each accepted with probability p (the one before
accepted) emits 1 + p + p^2 + ... + p^k tokens when k drafts are checked; a step of B
decodes costs the plain step's seconds plus a measured cost per checked draft token.
Draft j of a request adds p^j tokens and one draft's cost, so the drafts worth checking
are taken best first while each still raises tokens per second (`choose_draft_lengths`).
Where a step is compute bound (a large batch on a CPU) a draft costs about a decode's
share and only well-accepted ones pay; at batch 1 a step is bound by reading the
weights and most do.

`AdaptiveDrafting` keeps the measurements: per request, an exponential moving average of
its accepted drafts over its tested draft positions (from all requests' average at
first); per batch size bucket (powers of two), a line of a decode step's seconds over
its checked drafts, fitted to the bucket's recent steps (`_StepTimes`). A bucket measures
a plain step, then a probe checking the first draft of every proposal, before it chooses,
and again after `REFRESH_STEPS` steps without either, so a changing load or acceptance is
followed. The probe checks one draft per request, not whole proposals: that is enough to
test each request's acceptance and to place a point of the line away from zero drafts,
and where a step is compute bound (32 decodes on a CPU: a draft costs about a decode's
share) a step checking every draft of k = 8 proposals costs several plain steps, paid
every REFRESH_STEPS steps exactly where the model has found drafts do not pay.
Requests whose drafts the next step would not check are not proposed for at all
(`worth_proposing`): proposing costs time too.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

#: Weight a bucket's earlier step times keep at each new one.
STEP_TIME_DECAY = 0.9
#: Weight a request's earlier checks keep at each new one; all requests' average (a new
#: request's prior) keeps more, as it counts every request's checks.
ACCEPTANCE_DECAY = 0.8
ALL_ACCEPTANCE_DECAY = 0.98
#: Tested draft positions' worth of all requests' average a request's own estimate
#: starts from, so one check does not set it to 0 or 1.
PRIOR_TRIALS = 2.0
#: Steps of a bucket after which a plain step, or a probe step, is measured again.
REFRESH_STEPS = 16
#: Drafts of each proposal a probe step checks (the step that measures acceptance and
#: the per-draft cost where the choice has checked none for REFRESH_STEPS steps).
PROBE_DRAFTS = 1


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
class _StepTimes:
    """One batch size bucket's step times as decayed sums (recent steps count most) for
    a least-squares line of seconds over checked drafts: its intercept is a plain step's
    seconds, its slope a draft's. A line through many steps follows a shared host's load
    where a single plain step, measured once, would not."""

    weight: float = 0.0
    drafts: float = 0.0
    seconds: float = 0.0
    drafts_squared: float = 0.0
    drafts_seconds: float = 0.0
    #: Steps since one without drafts and since one with drafts (None: none yet).
    steps_since_plain: int | None = None
    steps_since_verify: int | None = None

    def add(self, num_drafts: int, seconds: float) -> None:
        """A step checking `num_drafts` drafts took `seconds`."""
        decay = STEP_TIME_DECAY
        self.weight = decay * self.weight + 1
        self.drafts = decay * self.drafts + num_drafts
        self.seconds = decay * self.seconds + seconds
        self.drafts_squared = decay * self.drafts_squared + num_drafts**2
        self.drafts_seconds = decay * self.drafts_seconds + num_drafts * seconds
        plain, verify = self.steps_since_plain, self.steps_since_verify
        self.steps_since_plain = 0 if num_drafts == 0 else None if plain is None else plain + 1
        self.steps_since_verify = 0 if num_drafts > 0 else None if verify is None else verify + 1

    def costs(self) -> StepCosts:
        """The fitted line (steps with and without drafts both measured)."""
        spread = self.weight * self.drafts_squared - self.drafts**2
        # Noise can tilt the line down: a draft costs at least nothing.
        slope = max(0.0, (self.weight * self.drafts_seconds - self.drafts * self.seconds) / spread)
        return StepCosts((self.seconds - slope * self.drafts) / self.weight, slope)


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
        self._buckets: dict[int, _StepTimes] = {}

    def acceptance(self, req_id: str) -> float:
        """The request's estimated per-draft acceptance probability: its own average,
        starting from all requests' (PRIOR_TRIALS worth), which starts from 1 (unmeasured:
        check the drafts, which measures them)."""
        prior = self._all_accepted / self._all_trials if self._all_trials > 0 else 1.0
        accepted, trials = self._accepted.get(req_id, 0.0), self._trials.get(req_id, 0.0)
        return (accepted + PRIOR_TRIALS * prior) / (trials + PRIOR_TRIALS)

    def observe_check(self, req_id: str, drafted: int, accepted: int) -> None:
        """A step checked `drafted` drafts of the request and accepted the first `accepted`."""
        trials = acceptance_trials(drafted, accepted)
        self._accepted[req_id] = ACCEPTANCE_DECAY * self._accepted.get(req_id, 0.0) + accepted
        self._trials[req_id] = ACCEPTANCE_DECAY * self._trials.get(req_id, 0.0) + trials
        self._all_accepted = ALL_ACCEPTANCE_DECAY * self._all_accepted + accepted
        self._all_trials = ALL_ACCEPTANCE_DECAY * self._all_trials + trials

    def forget(self, req_id: str) -> None:
        """The request finished: drop its average."""
        self._accepted.pop(req_id, None)
        self._trials.pop(req_id, None)

    def observe_step(self, num_decodes: int, num_drafts: int, seconds: float) -> None:
        """A step of `num_decodes` decodes only, checking `num_drafts` drafts in all, took `seconds`."""
        self._bucket(num_decodes).add(num_drafts, seconds)

    def draft_lengths(self, proposals: Mapping[str, int]) -> dict[str, int]:
        """How many drafts each decode of the step checks, by request id, given every
        decode's proposal length (0 for a decode without drafts)."""
        times = self._bucket(len(proposals))
        if times.steps_since_plain is None or times.steps_since_plain >= REFRESH_STEPS:
            return dict.fromkeys(proposals, 0)  # measure a plain step
        if times.steps_since_verify is None or times.steps_since_verify >= REFRESH_STEPS:
            return {req_id: min(length, PROBE_DRAFTS) for req_id, length in proposals.items()}  # a probe
        req_ids = list(proposals)
        lengths = choose_draft_lengths(
            [self.acceptance(req_id) for req_id in req_ids],
            [proposals[req_id] for req_id in req_ids],
            times.costs(),
        )
        return dict(zip(req_ids, lengths))

    def worth_proposing(self, req_ids: Sequence[str]) -> frozenset[str]:
        """Of a step's requests, those whose drafts the next step (of as many decodes)
        may check: a request's drafts pay only if its first does on its own, which
        needs acceptance x plain seconds > decodes x seconds per draft (others' drafts
        only raise the bar); all of them while the bucket is measuring, or probes next. Proposing costs time too (suffix: a walk per request)."""
        times = self._bucket(len(req_ids))
        plain, verify = times.steps_since_plain, times.steps_since_verify
        if plain is None or verify is None or verify + 1 >= REFRESH_STEPS:
            return frozenset(req_ids)
        costs = times.costs()
        bar = len(req_ids) * costs.seconds_per_draft
        return frozenset(req_id for req_id in req_ids if self.acceptance(req_id) * costs.plain_seconds > bar)

    def _bucket(self, num_decodes: int) -> _StepTimes:
        # Powers of two: a step's cost changes little between neighbouring batch sizes.
        return self._buckets.setdefault(max(0, num_decodes - 1).bit_length(), _StepTimes())
