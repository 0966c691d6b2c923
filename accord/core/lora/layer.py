"""The hook LoRA puts in a model: each target projection (fused qkv, o_proj, fused
gate_up, down_proj) becomes a `LoRALinear` around the layer's own linear, so the base
GEMM still runs once for the whole batch and ops.lora_linear adds each token's delta.
Nothing in the graphs changes; the wrappers are put in place after the model loads."""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

from ...op_contracts import OpDispatcher
from ..models.causal_lm import CausalLM
from ..models.layers import GatedMLP, GQAAttention
from ..models.layers.linear import Linear
from ..models.layers.parallel import RowParallelLinear
from .layout import LoRALayout


@dataclass
class LoRABatch:
    """The step's per-token adapter slots, shared by every LoRALinear of one model: the
    runner sets it before each forward (None: no token of the step has an adapter, and
    the projections run their base GEMM alone)."""

    slot_ids: torch.Tensor | None = None


@dataclass
class SlotWeights:
    """One projection's device slots: A [S, n*R, K] and B transposed [S, n*R, N] for its
    n stacked PEFT modules, slice i's A and B^T in rows [i*R, i*R + r) (B^T in the
    slice's own output columns, zero elsewhere, so one shrink and one expand serve every
    slice)."""

    lora_a: torch.Tensor
    lora_b: torch.Tensor
    #: Each slice's first output row.
    row_offsets: list[int] = field(default_factory=list)


class LoRALinear:
    """base(x), plus each token's adapter delta through ops.lora_linear when the step
    has adapter tokens."""

    def __init__(self, ops: OpDispatcher, base: Linear, weights: SlotWeights, batch: LoRABatch) -> None:
        self.ops = ops
        self.base = base
        self.weights = weights
        self.batch = batch
        self.out_features = base.out_features

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        y = self.base(x)
        slot_ids = self.batch.slot_ids
        if slot_ids is None:
            return y
        return self.ops.lora_linear(y, x, self.weights.lora_a, self.weights.lora_b, slot_ids)


#: Where each projection sits in a decoder layer: (the block's attribute, the linear's).
SITES = {"qkv": ("attention", "qkv"), "o_proj": ("attention", "o_proj"),
         "gate_up": ("feed_forward", "gate_up"), "down_proj": ("feed_forward", "down")}


def wrap_projections(
    model: CausalLM, ops: OpDispatcher, layout: LoRALayout, num_slots: int, max_rank: int
) -> tuple[LoRABatch, dict[tuple[int, str], SlotWeights]]:
    """Put a LoRALinear around every target projection of `model` (around a row-parallel
    one's local GEMM; zeroed slots of this rank's widths in the model's dtype on its device); returns the shared batch state and the slots by
    (layer, projection). Raises ValueError for a graph whose blocks are not GQA
    attention and a gated MLP (the layout's projections)."""
    dtype, device = model.embedding.table.dtype, model.embedding.table.device
    batch = LoRABatch()
    storage: dict[tuple[int, str], SlotWeights] = {}
    for index, layer in enumerate(model.layers):
        for projection in layout.projections:
            block_name, attr = SITES[projection]
            block = getattr(layer, block_name)
            if not isinstance(block, (GQAAttention, GatedMLP)):
                raise ValueError(f"LoRA needs GQA attention and a gated MLP; layer {index}'s {block_name} is "
                                 f"{type(block).__name__}")
            base: Linear = getattr(block, attr)
            widths = layout.slice_widths(projection)
            in_features = layout.local_in_features(projection)
            rank_width = len(widths) * max_rank
            weights = SlotWeights(
                torch.zeros(num_slots, rank_width, in_features, dtype=dtype, device=device),
                torch.zeros(num_slots, rank_width, sum(widths), dtype=dtype, device=device),
                [sum(widths[:i]) for i in range(len(widths))],
            )
            storage[(index, projection)] = weights
            if isinstance(base, RowParallelLinear):
                # The delta joins the rank's partial product before the all-reduce sums them.
                base.local = LoRALinear(ops, base.local, weights, batch)
            else:
                setattr(block, attr, LoRALinear(ops, base, weights, batch))
    return batch, storage
