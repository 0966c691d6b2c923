"""What the proposers that draft with a model share (a draft model, DeepSeek's MTP
layer): their KV cache in the target's blocks, the step they read, and the loop that
drafts k tokens one forward at a time.

The drafter's KV cache lives in the target's blocks: its own layer tensors, indexed by
the same block table per request, so allocation, prefix caching, preemption and the
roll-back of rejected drafts stay the block manager's one mechanism. While it drafts it
writes its drafts' KV into the request's lookahead slots (the scheduler allocates
`num_lookahead_tokens` past each step), which the next step's forward writes over.

Greedy requests draft the drafter's argmax. Sampled ones draw each draft from the
drafter's distribution q under the request's own temperature, top-k, top-p and min-p
(the check is lossless for any q the draft is drawn from, and q goes to
rejection_sample with the draft; filtered as the target's p is, q proposes no token the
check would always reject), from a generator of their own, so the draws are independent
of the check's uniforms.
"""

from __future__ import annotations

import random
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import torch

from ...models.layers.mlp import RoutedExperts
from ..attention import KVCacheSpec, LayerKVCache
from ..input_batch import CachedRequestState, InputBatch
from ...sampling_params import SamplingParams
from ..sampler import draw_seed, step_seed
from ..step_inputs import FlatBatch, StepInputs

#: Mixed into a request's draw seed for its drafts' generator, so the drafts never reuse
#: the uniforms that check them (that would bias the check).
DRAFT_STREAM = 0x9E3779B97F4A7C15


@dataclass(frozen=True)
class TargetStep:
    """The target's step, as a drafter reads it once its tokens have landed: the
    flattened batch, the target's hidden states of its rows, and where each request's
    rows start (requests in batch order, their tokens appended)."""

    flat: FlatBatch
    #: The final hidden states [T, H]; for a drafter with `feature_layers` (EAGLE-3),
    #: the residual stream entering those layers instead, concatenated [T, n * H].
    hidden: torch.Tensor
    requests: Sequence[CachedRequestState]
    #: Each request's first position this step (its computed tokens before it).
    num_computed: np.ndarray
    #: Each request's tokens this step.
    num_new: np.ndarray


@dataclass(frozen=True)
class Draft:
    """One request's drafted tokens and the distribution each was drawn from ([n, V]
    fp32; None for a greedy request, whose check reads only the tokens)."""

    token_ids: list[int]
    probs: torch.Tensor | None


@dataclass(frozen=True)
class DraftLogits:
    """A drafter's prediction of each drafting request's next draft: logits [N, V] and
    the hidden states [N, H] its next forward continues from (None: it needs none)."""

    logits: torch.Tensor
    hidden: torch.Tensor | None

    def rows(self, index: np.ndarray) -> DraftLogits:
        """These predictions of the requests at `index` only."""
        picked = torch.from_numpy(index).to(self.logits.device)
        return DraftLogits(self.logits[picked], None if self.hidden is None else self.hidden[picked])


class ModelDrafter:
    """Drafts up to k tokens per request with a model of its own KV layers; a subclass
    says how it reads the target's step and runs one drafting forward."""

    #: How far the KV position of a drafting forward lags its input token's position: 0
    #: for a draft model (token t_i at position i), 1 for a head (t_{i+1} at position i).
    lag = 0
    #: The target's layers whose input residual stream the drafter reads (EAGLE-3's
    #: features; none: the final hidden states, if anything).
    feature_layers: tuple[int, ...] = ()

    def __init__(self, num_speculative_tokens: int, step_inputs: StepInputs, rng: random.Random) -> None:
        self.k = num_speculative_tokens
        #: The drafter's own flattening buffers: its inputs must not overwrite the step's,
        #: which an asynchronous device may still be reading.
        self.step_inputs = step_inputs
        #: Unseeded requests draw their drafts' seeds from here (the sampler's).
        self._rng = rng
        self.kv_caches: list[LayerKVCache] = []

    @property
    def specs(self) -> list[KVCacheSpec]:
        """The drafter's layers' cache specs (their bytes count in every block)."""
        raise NotImplementedError

    def moe_blocks(self) -> list[RoutedExperts]:
        """The drafter's routed-expert blocks (profile_run routes them by their worst case)."""
        raise NotImplementedError

    def observe(self, step: TargetStep, drafting: Sequence[CachedRequestState], batch: InputBatch) -> DraftLogits | None:
        """Bring the drafter's KV up to the target's after `step`; the first drafts'
        logits of `drafting` where that forward gives them (else None)."""
        raise NotImplementedError

    def forward(self, input_ids: torch.Tensor, flat: FlatBatch, hidden: torch.Tensor | None) -> DraftLogits:
        """One drafting forward: the newest token of each request at `flat`'s positions."""
        raise NotImplementedError

    def profile(self, flat: FlatBatch, target_hidden: torch.Tensor, last_rows: torch.Tensor) -> None:
        """The drafter's heaviest forward of a step, for profile_run: over every token of
        the target's step `flat` (what `observe` runs at most: each position of a prompt
        chunk), from the target's hidden states (or features) `target_hidden` of its rows,
        with the logits of each sequence's last row (`last_rows`), into `kv_caches`. A
        drafting forward (one token per request) is never larger."""
        raise NotImplementedError

    def propose(
        self, step: TargetStep, drafting: Sequence[CachedRequestState], batch: InputBatch, block_size: int
    ) -> dict[str, Draft]:
        """Bring the drafter up to the step, then draft up to k tokens after each of
        `drafting` (fewer where its allocated slots, its max_tokens or the context end
        leave less room). The drafts are also written after each request's known tokens
        in `batch`, where the next step reads its inputs."""
        first = self.observe(step, drafting, batch)
        if not drafting:
            return {}
        max_model_len = batch.token_ids_np.shape[1]
        rooms = np.array([self._room(state, block_size, max_model_len) for state in drafting], dtype=np.int64)
        drafted: list[list[int]] = [[] for _ in drafting]
        probs: list[list[torch.Tensor]] = [[] for _ in drafting]
        generators = {
            b: torch.Generator("cpu").manual_seed(step_seed(draw_seed(state, self._rng), DRAFT_STREAM))
            for b, state in enumerate(drafting) if not state.params.greedy
        }
        active, previous = np.flatnonzero(rooms > 0), None
        # The predictions of the active requests' next drafts (None: a forward makes them).
        out = None if first is None else first.rows(active)
        for j in range(int(rooms.max(initial=0))):
            rows = np.array([drafting[b].row for b in active], dtype=np.int64)
            # The newest token of each request (the target's last, then each draft) and its position.
            token_positions = np.array([drafting[b].num_tokens - 1 + j for b in active], dtype=np.int64)
            if out is None:
                flat = self.step_inputs.flatten(batch.token_ids_np, batch.block_table_np, rows,
                                                token_positions - self.lag, np.ones(len(active), dtype=np.int64))
                input_ids = torch.from_numpy(batch.token_ids_np[rows, token_positions].astype(np.int64))
                out = self.forward(input_ids.to(flat.input_ids.device), flat, previous)
            tokens = self._draw(out.logits, [drafting[b] for b in active], generators, active, probs)
            for b, token in zip(active, tokens):
                drafted[b].append(token)
            batch.token_ids_np[rows, token_positions + 1] = tokens
            keep = np.flatnonzero(rooms[active] > j + 1)
            previous = None if out.hidden is None else out.rows(keep).hidden
            active, out = active[keep], None
            if not len(active):
                break
        return {
            state.req_id: Draft(drafted[b], torch.stack(probs[b]) if probs[b] else None)
            for b, state in enumerate(drafting) if drafted[b]
        }

    def _draw(self, logits: torch.Tensor, requests: list[CachedRequestState], generators: dict[int, torch.Generator],
              active: np.ndarray, probs: list[list[torch.Tensor]]) -> list[int]:
        """Each request's draft from its logits row: the argmax, or (sampled requests) a
        draw from the request's sampling distribution of the row, which is kept in `probs`."""
        tokens = logits.argmax(dim=-1).tolist()
        for i, (b, state) in enumerate(zip(active, requests)):
            if not state.params.greedy:
                q = draft_distribution(logits[i], state.params).cpu()
                tokens[i] = int(torch.multinomial(q, 1, generator=generators[b]))
                probs[b].append(q)
        return tokens

    def _room(self, state: CachedRequestState, block_size: int, max_model_len: int) -> int:
        """How many drafts `state` may take: draft i (from 1) sits at position
        num_tokens - 1 + i, and is drafted from KV the drafter wrote at positions up to
        num_tokens - 2 + i - lag, which must lie in the request's allocated blocks."""
        room = min(self.k, max_model_len - state.num_tokens,
                   state.num_blocks * block_size - state.num_tokens + 1 + self.lag)
        if state.params.max_tokens is not None:
            room = min(room, state.params.max_tokens - state.num_output_tokens - 1)
        return max(0, room)


def draft_distribution(logits: torch.Tensor, params: SamplingParams) -> torch.Tensor:
    """[V] fp32: softmax(logits / temperature) under `params`' top-k, top-p and min-p, in
    that order, each renormalised (the sample contract's filters: top-k keeps what ties
    the k-th largest, top-p each token whose more likely predecessors hold less than
    top_p, in a stable order, min-p what reaches min_p times the largest)."""
    probs = torch.softmax(logits.float() / params.temperature, dim=-1)
    if params.top_k > 0:
        kth = probs.topk(min(params.top_k, probs.numel())).values[-1]
        probs = _kept(probs, probs >= kth)
    if params.top_p < 1.0:
        ordered, order = probs.sort(descending=True, stable=True)
        keep = torch.empty_like(probs, dtype=torch.bool)
        keep[order] = (ordered.cumsum(0) - ordered) < params.top_p
        probs = _kept(probs, keep)
    if params.min_p > 0.0:
        probs = _kept(probs, probs >= params.min_p * probs.max())
    return probs


def _kept(probs: torch.Tensor, keep: torch.Tensor) -> torch.Tensor:
    kept = probs * keep
    return kept / kept.sum()
