"""The draft_model proposer: a smaller model with the target's vocabulary drafts k
tokens per request, one forward per token (accord.core.worker.drafting.base).

The draft runs every forward the target runs (prompt chunks, checked drafts) over the
same flattened batch, writing its KV at the same slots, so a block holds the draft's KV
of exactly the tokens whose target KV it holds (a prefix-cache hit is one for both).
"""

from __future__ import annotations

import random
from collections.abc import Sequence

import torch

from ...models import CausalLM
from ...models.layers.mlp import RoutedExperts
from ..attention import KVCacheSpec
from ..input_batch import CachedRequestState, InputBatch
from ..step_inputs import FlatBatch, StepInputs
from .base import DraftLogits, ModelDrafter, TargetStep


class DraftModelProposer(ModelDrafter):
    """Drafts with a smaller model sharing the target's vocabulary and KV blocks."""

    def __init__(self, model: CausalLM, num_speculative_tokens: int, step_inputs: StepInputs,
                 rng: random.Random) -> None:
        super().__init__(num_speculative_tokens, step_inputs, rng)
        self.model = model

    @property
    def specs(self) -> list[KVCacheSpec]:
        return self.model.kv_cache_specs()

    def moe_blocks(self) -> list[RoutedExperts]:
        return self.model.moe_blocks()

    def observe(self, step: TargetStep, drafting: Sequence[CachedRequestState], batch: InputBatch) -> DraftLogits | None:
        """Run the draft over the step's tokens, writing its KV where the target wrote its own."""
        flat = step.flat
        self.model.forward(flat.input_ids, flat.positions, flat.attn, self.kv_caches)
        return None

    def forward(self, input_ids: torch.Tensor, flat: FlatBatch, hidden: torch.Tensor | None) -> DraftLogits:
        out = self.model.forward(input_ids, flat.positions, flat.attn, self.kv_caches)
        return DraftLogits(self.model.compute_logits(out), None)

    def profile(self, flat: FlatBatch, target_hidden: torch.Tensor, last_rows: torch.Tensor) -> None:
        out = self.model.forward(flat.input_ids, flat.positions, flat.attn, self.kv_caches)
        self.model.compute_logits(out[last_rows])
