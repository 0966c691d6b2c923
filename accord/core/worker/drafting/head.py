"""The proposers whose model is a head over the target's hidden states: DeepSeek-V3's
multi-token-prediction layer (mtp, accord.core.models.deepseek_mtp) and EAGLE/EAGLE-3
heads (eagle, eagle3, accord.core.models.eagle). They draft k tokens per request, the
head run again on its own output for each draft after the first (as vLLM runs them).

At position i a head reads the target's hidden state h_i (EAGLE-3: its features of
three layers, through the head's fc) and the token t_{i+1}, so its KV at i can be
written only once t_{i+1} is known: after each step it runs over the step's positions
whose next token has landed (all of a prompt chunk's; a decode's up to the last accepted
one), and the last of those predicts the first draft. With a prefix-cache hit the head's
KV at a cached block's last position came from the token that followed it in the
request that computed it, which may differ: that can only cost acceptance, never change
an output.
"""

from __future__ import annotations

import random
from collections.abc import Sequence
from typing import Protocol

import numpy as np
import torch

from ...models.layers.mlp import RoutedExperts
from ..attention import AttentionMetadata, KVCacheSpec, LayerKVCache
from ..input_batch import CachedRequestState, InputBatch
from ..step_inputs import FlatBatch, StepInputs
from .base import DraftLogits, ModelDrafter, TargetStep


class DraftHead(Protocol):
    """A head drafting from the target's hidden states (MtpLayer, EagleHead, Eagle3Head)."""

    #: The target's layers whose input residual stream it reads (none: the final hidden states).
    feature_layers: tuple[int, ...]

    def kv_cache_specs(self) -> list[KVCacheSpec]:
        """Its layers' cache specs."""
        ...

    def target_features(self, hidden: torch.Tensor) -> torch.Tensor:
        """The h_i it reads at each row of the target's hidden states (or features)."""
        ...

    def moe_blocks(self) -> list[RoutedExperts]:
        """Its routed-expert blocks (none in a dense head)."""
        ...

    def forward(self, input_ids: torch.Tensor, positions: torch.Tensor, previous_hidden: torch.Tensor,
                attn: AttentionMetadata, kv_caches: Sequence[LayerKVCache]) -> torch.Tensor:
        """Its hidden states of tokens t_{i+1} after h_i at positions i (writes its KV)."""
        ...

    def compute_logits(self, hidden: torch.Tensor) -> torch.Tensor:
        """Logits [N, V] fp32 over the target's vocabulary from its hidden states."""
        ...


class HeadProposer(ModelDrafter):
    """Drafts with a head over the target's hidden states."""

    lag = 1

    def __init__(self, layer: DraftHead, num_speculative_tokens: int, step_inputs: StepInputs,
                 rng: random.Random) -> None:
        super().__init__(num_speculative_tokens, step_inputs, rng)
        self.layer = layer

    @property
    def specs(self) -> list[KVCacheSpec]:
        return self.layer.kv_cache_specs()

    @property
    def feature_layers(self) -> tuple[int, ...]:
        return self.layer.feature_layers

    def moe_blocks(self) -> list[RoutedExperts]:
        return self.layer.moe_blocks()

    def observe(self, step: TargetStep, drafting: Sequence[CachedRequestState], batch: InputBatch) -> DraftLogits | None:
        """Run the head over each request's step positions whose next token is known,
        from the target's hidden states there; the last one of each drafting request
        predicts its first draft."""
        known = np.fromiter((state.num_tokens - 1 for state in step.requests), np.int64, len(step.requests))
        counts = np.minimum(step.num_computed + step.num_new, known) - step.num_computed
        taken = np.flatnonzero(counts > 0)
        if not len(taken):
            return None
        starts, counts = step.num_computed[taken], counts[taken]
        rows = np.fromiter((step.requests[b].row for b in taken), np.int64, len(taken))
        flat = self.step_inputs.flatten(batch.token_ids_np, batch.block_table_np, rows, starts, counts)
        # Each position's input is the token after it, beside the target's hidden state there.
        positions = flat.positions.cpu().numpy()
        next_tokens = batch.token_ids_np[np.repeat(rows, counts), positions + 1].astype(np.int64)
        target_rows = np.concatenate([
            np.arange(first, first + count)
            for first, count in zip(step.flat.last_rows[taken] - step.num_new[taken] + 1, counts)
        ])
        hidden = self.layer.forward(
            torch.from_numpy(next_tokens).to(flat.input_ids.device), flat.positions,
            self.layer.target_features(step.hidden[torch.from_numpy(target_rows).to(step.hidden.device)]),
            flat.attn, self.kv_caches,
        )
        if not drafting:
            return None
        last_row = {step.requests[b].req_id: int(row) for b, row in zip(taken, flat.last_rows)}
        picked = torch.from_numpy(np.array([last_row[state.req_id] for state in drafting], dtype=np.int64))
        last = hidden[picked.to(hidden.device)]
        return DraftLogits(self.layer.compute_logits(last), last)

    def forward(self, input_ids: torch.Tensor, flat: FlatBatch, hidden: torch.Tensor | None) -> DraftLogits:
        assert hidden is not None, "a head's forward continues from the previous hidden states"
        out = self.layer.forward(input_ids, flat.positions, hidden, flat.attn, self.kv_caches)
        return DraftLogits(self.layer.compute_logits(out), out)

    def profile(self, flat: FlatBatch, target_hidden: torch.Tensor, last_rows: torch.Tensor) -> None:
        previous = self.layer.target_features(target_hidden)
        out = self.layer.forward(flat.input_ids, flat.positions, previous, flat.attn, self.kv_caches)
        self.layer.compute_logits(out[last_rows])
