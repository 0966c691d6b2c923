"""The draft_model proposer: a smaller model with the target's vocabulary drafts k
tokens per request, one forward per token, for the target to check in one forward.

Its KV cache lives in the target's blocks: the draft's own layer tensors, indexed by
the same block table per request, so allocation, prefix caching, preemption and the
roll-back of rejected drafts stay the block manager's one mechanism. The draft runs
every forward the target runs (prompt chunks, checked drafts), writing its KV at the
same slots, so a block holds the draft's KV of exactly the tokens whose target KV it
holds (a prefix-cache hit is one for both). Proposing then writes the KV of the drafts
themselves into the request's lookahead slots (the scheduler allocates
`num_lookahead_tokens` past each step), which the next step's forward writes over.

Greedy requests draft the draft's argmax. Sampled ones draw each draft from the draft's
tempered distribution q (no top-k/top-p: the check is lossless for any q that the draft
is drawn from, and q is handed to rejection_sample with the draft), from a generator of
their own, so the draws are independent of the check's uniforms.
"""

from __future__ import annotations

import random
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import torch

from ..models import CausalLM
from ..worker.attention import KVCacheSpec, LayerKVCache
from ..worker.input_batch import CachedRequestState, InputBatch
from ..worker.sampler import draw_seed, step_seed
from ..worker.step_inputs import FlatBatch, StepInputs

#: Mixed into a request's draw seed for its drafts' generator, so the drafts never reuse
#: the uniforms that check them (that would bias the check).
DRAFT_STREAM = 0x9E3779B97F4A7C15


@dataclass(frozen=True)
class Draft:
    """One request's drafted tokens and the distribution each was drawn from ([n, V]
    fp32; None for a greedy request, whose check reads only the tokens)."""

    token_ids: list[int]
    probs: torch.Tensor | None


class DraftModelProposer:
    """Drafts with a smaller model sharing the target's vocabulary and KV blocks."""

    def __init__(self, model: CausalLM, num_speculative_tokens: int, step_inputs: StepInputs,
                 rng: random.Random) -> None:
        self.model = model
        self.k = num_speculative_tokens
        #: The draft's own flattening buffers: a proposal's inputs must not overwrite the
        #: step's, which the target's forward is still reading on an asynchronous device.
        self.step_inputs = step_inputs
        #: Unseeded requests draw their drafts' seeds from here (the sampler's).
        self._rng = rng
        self.kv_caches: list[LayerKVCache] = []

    @property
    def specs(self) -> list[KVCacheSpec]:
        """The draft's layers' cache specs (their bytes count in every block)."""
        return self.model.kv_cache_specs()

    def observe(self, flat: FlatBatch) -> None:
        """Run the draft over a step's tokens, writing its KV where the target writes its own."""
        self.model.forward(flat.input_ids, flat.positions, flat.attn, self.kv_caches)

    def propose(self, requests: Sequence[CachedRequestState], batch: InputBatch, block_size: int) -> dict[str, Draft]:
        """Up to k drafts after each request's tokens (fewer where its allocated slots,
        its max_tokens or the context end leave less room); the drafted tokens are also
        written after the request's known tokens in `batch`, where the next step reads
        its inputs."""
        max_model_len = batch.token_ids_np.shape[1]
        rooms = np.array([self._room(state, block_size, max_model_len) for state in requests], dtype=np.int64)
        drafted: list[list[int]] = [[] for _ in requests]
        probs: list[list[torch.Tensor]] = [[] for _ in requests]
        generators = {
            b: torch.Generator("cpu").manual_seed(step_seed(draw_seed(state, self._rng), DRAFT_STREAM))
            for b, state in enumerate(requests) if not state.params.greedy
        }
        for step in range(int(rooms.max(initial=0))):
            active = np.flatnonzero(rooms > step)
            rows = np.array([requests[b].row for b in active], dtype=np.int64)
            # Each active request's newest token (the target's last, then each draft) at its position.
            positions = np.array([requests[b].num_tokens - 1 + step for b in active], dtype=np.int64)
            flat = self.step_inputs.flatten(batch.token_ids_np, batch.block_table_np, rows, positions,
                                            np.ones(len(active), dtype=np.int64))
            hidden = self.model.forward(flat.input_ids, flat.positions, flat.attn, self.kv_caches)
            logits = self.model.compute_logits(hidden)
            tokens = logits.argmax(dim=-1).tolist()
            for i, b in enumerate(active):
                params = requests[b].params
                if not params.greedy:
                    q = torch.softmax(logits[i].float() / params.temperature, dim=-1).cpu()
                    tokens[i] = int(torch.multinomial(q, 1, generator=generators[b]))
                    probs[b].append(q)
                drafted[b].append(tokens[i])
            batch.token_ids_np[rows, positions + 1] = tokens
        return {
            state.req_id: Draft(drafted[b], torch.stack(probs[b]) if probs[b] else None)
            for b, state in enumerate(requests) if drafted[b]
        }

    def _room(self, state: CachedRequestState, block_size: int, max_model_len: int) -> int:
        """How many drafts `state` may take: draft i (from 1) sits at position
        num_tokens - 1 + i and is drafted from the KV of the positions before it, which
        must lie in the request's allocated blocks."""
        room = min(self.k, max_model_len - state.num_tokens, state.num_blocks * block_size - state.num_tokens + 1)
        if state.params.max_tokens is not None:
            room = min(room, state.params.max_tokens - state.num_output_tokens - 1)
        return max(0, room)
