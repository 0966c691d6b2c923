"""fused_moe's sort of (token, k) slots by expert: every slot routed to a local expert
lands exactly once in a row block of that expert, and slots routed elsewhere (-1) never
appear."""

from __future__ import annotations

import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from accord.backends.triton.kernels.fused_moe import sort_by_expert

BLOCK_M = 4


@settings(max_examples=60, deadline=None)
@given(
    experts=st.integers(1, 6),
    ids=st.lists(st.lists(st.integers(-1, 5), min_size=2, max_size=2), min_size=0, max_size=9),
)
def test_every_local_slot_lands_once_in_a_block_of_its_expert(experts, ids):
    local_ids = torch.tensor(ids, dtype=torch.int64).reshape(-1, 2).clamp_max(experts - 1)
    order = sort_by_expert(local_ids, experts, BLOCK_M)
    flat = local_ids.flatten()
    placed = order.slots[order.slots < order.num_slots]
    assert sorted(placed.tolist()) == [s for s in range(flat.numel()) if flat[s] >= 0]
    block_of_row = order.block_experts.repeat_interleave(BLOCK_M)
    real = order.slots < order.num_slots
    assert torch.equal(block_of_row[real], flat[order.slots[real]])
