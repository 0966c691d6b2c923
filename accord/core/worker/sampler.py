"""Turns logits into tokens: penalties and min_tokens with torch ops, then the sample
contract (temperature, top-k, top-p, min-p, seeded draw, logprobs).

A seeded row's draw depends only on the request's seed and how many tokens it has
generated, never on its batch mates, so seeded requests reproduce alone or batched.
"""

from __future__ import annotations

import random
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol

import torch

from ...op_contracts import OpDispatcher
from ..outputs import Logprob
from ..sampling_params import SamplingParams
from ..structured_output import GrammarBitmask, apply_token_bitmask
from ..thinking import forced_thinking_token

_SEED_MASK = (1 << 63) - 1
_SEED_MULTIPLIER = 6364136223846793005


def step_seed(seed: int, num_output_tokens: int) -> int:
    """The draw seed of a seeded request's next token (a fixed mix of the two)."""
    return (seed * _SEED_MULTIPLIER + num_output_tokens + 1) & _SEED_MASK


class SamplingRow(Protocol):
    """What sampling reads of a request: its settings and its tokens so far."""

    @property
    def params(self) -> SamplingParams: ...

    @property
    def prompt_token_ids(self) -> Sequence[int]: ...

    @property
    def output_token_ids(self) -> Sequence[int]: ...

    @property
    def num_output_tokens(self) -> int: ...

    @property
    def req_id(self) -> str: ...


@dataclass
class SampledTokens:
    """A step's results, one entry per row: the token, its logprob (None when the step
    took the greedy fast path: no row asked for logprobs), and its logprob entry when
    the row asked (else None)."""

    token_ids: list[int]
    logprobs: list[float | None]
    top_logprobs: list[dict[int, Logprob] | None]


class Sampler:
    """Samples one token per row of logits for the given sequences."""

    def __init__(self, ops: OpDispatcher, seed: int = 0) -> None:
        self.ops = ops
        #: Unseeded requests draw their per-step seeds from here.
        self.rng = random.Random(seed)
        # The last step's settings and their tensors (temperature, top_k, top_p, min_p):
        # a batch keeps its requests for many steps, and each tensor costs tens of us here.
        self._settings: tuple[list[SamplingParams], tuple[torch.Tensor, ...]] | None = None

    def __call__(
        self, logits: torch.Tensor, seqs: Sequence[SamplingRow], grammar_bitmask: GrammarBitmask | None = None
    ) -> SampledTokens:
        """Tokens for `seqs`, row b of `logits` ([B, V] fp32) being sequence b's; rows
        of constrained requests keep only the tokens `grammar_bitmask` allows."""
        params = [seq.params for seq in seqs]
        logits = apply_penalties(logits, seqs)
        logits = mask_stop_tokens_before_min_tokens(logits, seqs)
        logits = apply_logit_bias(logits, seqs)
        if grammar_bitmask is not None:
            # Last, so no bias or penalty can revive a token the grammar forbids.
            logits = apply_token_bitmask(logits, {seq.req_id: b for b, seq in enumerate(seqs)}, grammar_bitmask)
        logits = force_thinking_end(logits, seqs)
        if all(p.greedy and p.logprobs is None for p in params):
            # Every row is the argmax and nobody reads a logprob: no softmax, no draw
            # (the sample contract's greedy rows are this argmax, first maximum on ties).
            tokens = logits.argmax(dim=-1).tolist()
            return SampledTokens(tokens, [None] * len(tokens), [None] * len(tokens))
        temperature, top_k, top_p, min_p = self._settings_tensors(params, logits.device)
        seeds = torch.tensor([draw_seed(seq, self.rng) for seq in seqs], dtype=torch.int64, device=logits.device)
        num_logprobs = max((p.logprobs or 0 for p in params), default=0)
        token_ids, logprobs, top_logprobs, top_token_ids = self.ops.sample(
            logits, temperature, top_k, top_p, min_p, seeds, num_logprobs=num_logprobs
        )
        tokens, chosen = token_ids.tolist(), logprobs.tolist()
        if not any(p.logprobs is not None for p in params):
            return SampledTokens(tokens, chosen, [None] * len(tokens))
        ranks = (logits > logits.gather(1, token_ids[:, None])).sum(1).add_(1).tolist()
        top_values, top_ids = top_logprobs.tolist(), top_token_ids.tolist()
        tops: list[dict[int, Logprob] | None] = []
        for b, p in enumerate(params):
            top = None
            if p.logprobs is not None:
                top = {tokens[b]: Logprob(chosen[b], ranks[b])}
                for rank, (token, value) in enumerate(zip(top_ids[b][: p.logprobs], top_values[b][: p.logprobs]), 1):
                    top.setdefault(token, Logprob(value, rank))
            tops.append(top)
        return SampledTokens(tokens, chosen, tops)

    def _settings_tensors(self, params: list[SamplingParams], device: torch.device) -> tuple[torch.Tensor, ...]:
        """Per-row temperature, top_k, top_p and min_p tensors, rebuilt only when the
        rows' settings objects differ from the last step's (settings never change)."""
        cached = self._settings
        if (
            cached is not None
            and len(cached[0]) == len(params)
            and all(a is b for a, b in zip(cached[0], params))
            and cached[1][0].device == device
        ):
            return cached[1]
        tensors = (
            torch.tensor([p.temperature for p in params], dtype=torch.float32, device=device),
            torch.tensor([p.top_k for p in params], dtype=torch.int32, device=device),
            torch.tensor([p.top_p for p in params], dtype=torch.float32, device=device),
            torch.tensor([p.min_p for p in params], dtype=torch.float32, device=device),
        )
        self._settings = (params, tensors)
        return tensors



def draw_seed(seq: SamplingRow, rng: random.Random) -> int:
    """The seed of `seq`'s next draw: from its own seed and progress when it has one,
    else the next from `rng`."""
    if seq.params.seed is None:
        return rng.getrandbits(63)
    return step_seed(seq.params.seed, seq.num_output_tokens)


def apply_penalties(logits: torch.Tensor, seqs: Sequence[SamplingRow]) -> torch.Tensor:
    """vLLM's penalties on the rows that ask for them: repetition divides positive
    (multiplies negative) logits of tokens seen in prompt or output; frequency and
    presence subtract per output occurrence and per distinct output token."""
    rows = [b for b, seq in enumerate(seqs) if seq.params.has_penalties]
    if not rows:
        return logits
    logits = logits.clone()
    vocab = logits.shape[1]
    device = logits.device
    counts = torch.zeros(len(rows), vocab, dtype=torch.float32, device=device)
    seen_in_prompt = torch.zeros(len(rows), vocab, dtype=torch.bool, device=device)
    for i, b in enumerate(rows):
        output = torch.tensor(seqs[b].output_token_ids, dtype=torch.int64, device=device)
        counts[i].index_add_(0, output, torch.ones(len(output), device=device))
        seen_in_prompt[i, torch.tensor(seqs[b].prompt_token_ids, dtype=torch.int64, device=device)] = True
    index = torch.tensor(rows, device=device)
    picked = logits[index]
    per_row = [
        (seqs[b].params.repetition_penalty, seqs[b].params.frequency_penalty, seqs[b].params.presence_penalty)
        for b in rows
    ]
    repetition, frequency, presence = torch.tensor(per_row, dtype=torch.float32, device=device).unbind(1)
    seen = seen_in_prompt | (counts > 0)
    penalised = torch.where(picked > 0, picked / repetition[:, None], picked * repetition[:, None])
    picked = torch.where(seen, penalised, picked)
    picked = picked - frequency[:, None] * counts - presence[:, None] * (counts > 0)
    logits[index] = picked
    return logits


def mask_stop_tokens_before_min_tokens(logits: torch.Tensor, seqs: Sequence[SamplingRow]) -> torch.Tensor:
    """Rows that have not reached min_tokens cannot pick a stop token."""
    rows = [
        b
        for b, seq in enumerate(seqs)
        if seq.num_output_tokens < seq.params.min_tokens and seq.params.all_stop_token_ids
    ]
    if not rows:
        return logits
    logits = logits.clone()
    for b in rows:
        logits[b, list(seqs[b].params.all_stop_token_ids)] = float("-inf")
    return logits


def apply_logit_bias(logits: torch.Tensor, seqs: Sequence[SamplingRow]) -> torch.Tensor:
    """Add each row's `logit_bias` (token id -> value) to its logits."""
    rows = [b for b, seq in enumerate(seqs) if seq.params.logit_bias]
    if not rows:
        return logits
    logits = logits.clone()
    for b in rows:
        bias = seqs[b].params.logit_bias
        ids = torch.tensor(list(bias), dtype=torch.int64, device=logits.device)  # type: ignore[arg-type]
        values = torch.tensor(list(bias.values()), dtype=logits.dtype, device=logits.device)  # type: ignore[union-attr]
        logits[b].index_add_(0, ids, values)
    return logits


def force_thinking_end(logits: torch.Tensor, seqs: Sequence[SamplingRow]) -> torch.Tensor:
    """Rows whose thinking has spent its `thinking_token_budget` can only pick the end
    marker (every other logit -inf: the draw is certain, its logprob 0)."""
    forced = [
        (b, token) for b, seq in enumerate(seqs)
        if (token := forced_thinking_token(seq.params.thinking_markers, seq.params.thinking_token_budget,
                                           seq.prompt_token_ids, seq.output_token_ids)) is not None
    ]
    if not forced:
        return logits
    logits = logits.clone()
    for b, token in forced:
        logits[b] = float("-inf")
        logits[b, token] = 0.0
    return logits


def prompt_logprobs(logits: torch.Tensor, next_token_ids: list[int], num: int) -> list[dict[int, Logprob]]:
    """For prompt rows: the logprob of each actual next prompt token and the top `num`."""
    logprobs = torch.log_softmax(logits.float(), dim=-1)
    targets = torch.tensor(next_token_ids, dtype=torch.int64, device=logits.device)[:, None]
    chosen = logprobs.gather(1, targets)
    ranks = (logprobs > chosen).sum(1).add_(1).tolist()
    top = logprobs.topk(num, dim=-1) if num > 0 else None
    entries = []
    for row, token in enumerate(next_token_ids):
        entry = {token: Logprob(float(chosen[row]), ranks[row])}
        if top is not None:
            for rank, (value, candidate) in enumerate(zip(top.values[row].tolist(), top.indices[row].tolist()), 1):
                entry.setdefault(candidate, Logprob(value, rank))
        entries.append(entry)
    return entries
