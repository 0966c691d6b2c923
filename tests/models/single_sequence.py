"""A minimal single-sequence runner for the model tests: allocates one sequence's KV
blocks, prefills a prompt, then decodes greedily one token per step. The engine's
model runner replaces it; this one only has to be obviously right."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from accord.core.worker.attention import AttentionMetadata, KVCacheSpec, LayerKVCache
from accord.core.models import CausalLM

BLOCK_SIZE = 16
INDEX_DTYPE = torch.int32


@dataclass
class SingleSequenceRunner:
    """Runs one sequence of at most `max_tokens` tokens through `model`. Blocks are
    handed out in reverse order so that logical and physical block ids differ, as they
    will under a real block manager."""

    model: CausalLM
    max_tokens: int

    def __post_init__(self) -> None:
        num_blocks = -(-self.max_tokens // BLOCK_SIZE)
        self.device = self.model.embedding.table.device
        self.block_table = torch.arange(num_blocks - 1, -1, -1, dtype=INDEX_DTYPE, device=self.device)
        self.kv_caches = [self._allocate(spec, num_blocks) for spec in self.model.kv_cache_specs()]
        self.length = 0

    def _allocate(self, spec: KVCacheSpec, num_blocks: int) -> LayerKVCache:
        dtype = self.model.config.dtype
        if spec.kind == "mla":
            return (torch.zeros(num_blocks, BLOCK_SIZE, spec.head_size, dtype=dtype, device=self.device),)
        shape = (num_blocks, BLOCK_SIZE, spec.num_kv_heads, spec.head_size)
        return (torch.zeros(shape, dtype=dtype, device=self.device), torch.zeros(shape, dtype=dtype, device=self.device))

    def step(self, token_ids: list[int]) -> torch.Tensor:
        """Feed `token_ids` (the prompt, or one decoded token); their fp32 logits [n, V] on the CPU."""
        positions = torch.arange(self.length, self.length + len(token_ids), device=self.device)
        self.length += len(token_ids)
        slots = self.block_table.long()[positions // BLOCK_SIZE] * BLOCK_SIZE + positions % BLOCK_SIZE
        attn = AttentionMetadata(
            slot_mapping=slots.to(INDEX_DTYPE),
            block_tables=self.block_table[None, :],
            seq_lens=torch.tensor([self.length], dtype=INDEX_DTYPE, device=self.device),
            query_start_loc=torch.tensor([0, len(token_ids)], dtype=INDEX_DTYPE, device=self.device),
            max_query_len=len(token_ids),
            max_seq_len=self.length,
        )
        hidden = self.model.forward(torch.tensor(token_ids, device=self.device), positions, attn, self.kv_caches)
        return self.model.compute_logits(hidden).cpu()

    def generate(self, prompt: list[int], max_new_tokens: int) -> tuple[torch.Tensor, list[int]]:
        """(prompt logits [len(prompt), V], greedy continuation of `max_new_tokens` tokens)."""
        prompt_logits = self.step(prompt)
        tokens = [int(prompt_logits[-1].argmax())]
        while len(tokens) < max_new_tokens:
            tokens.append(int(self.step(tokens[-1:])[-1].argmax()))
        return prompt_logits, tokens
