"""A model graph serves the engine's flattened varlen batches: sequences sharing one
forward get the logits each gets alone (no per-sequence state in the graph)."""

from __future__ import annotations

import pytest
import torch

from accord.backends import get_backend
from accord.core.worker.attention import AttentionMetadata
from accord.core.model_loader.load import load_model
from accord.op_contracts import OpDispatcher
from tiny_models import fixed_prompt
from single_sequence import BLOCK_SIZE, SingleSequenceRunner

LENGTHS = (40, 24)


def batched_prefill(model, prompts: list[list[int]]) -> torch.Tensor:
    """Logits of all prompts prefilled in one varlen step, each in its own blocks."""
    blocks_per_seq = -(-max(map(len, prompts)) // BLOCK_SIZE)
    caches = SingleSequenceRunner(model, blocks_per_seq * BLOCK_SIZE * len(prompts)).kv_caches
    block_tables = torch.arange(blocks_per_seq * len(prompts), dtype=torch.int32).view(len(prompts), -1)
    positions = torch.cat([torch.arange(len(p)) for p in prompts])
    slots = torch.cat([block_tables[b].long()[torch.arange(len(p)) // BLOCK_SIZE] * BLOCK_SIZE
                       + torch.arange(len(p)) % BLOCK_SIZE for b, p in enumerate(prompts)])
    lengths = torch.tensor([len(p) for p in prompts], dtype=torch.int32)
    attn = AttentionMetadata(
        slot_mapping=slots, block_tables=block_tables, seq_lens=lengths,
        query_start_loc=torch.cat([torch.zeros(1, dtype=torch.int32), lengths.cumsum(0).int()]),
        max_query_len=int(lengths.max()), max_seq_len=int(lengths.max()),
    )
    tokens = torch.tensor([t for p in prompts for t in p])
    return model.compute_logits(model.forward(tokens, positions, attn, caches))


@pytest.mark.parametrize("name", ["llama", "deepseek_v3"])
def test_sequences_batched_together_get_their_solo_logits(name, checkpoint):
    model = load_model(checkpoint(name), OpDispatcher(get_backend("reference"), strict=True)).model
    prompt = fixed_prompt()
    prompts = [prompt[: LENGTHS[0]], prompt[LENGTHS[0] : LENGTHS[0] + LENGTHS[1]]]
    solo = torch.cat([SingleSequenceRunner(model, len(p)).step(p) for p in prompts])
    torch.testing.assert_close(batched_prefill(model, prompts), solo, rtol=1e-5, atol=1e-5)
