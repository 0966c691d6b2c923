"""The typed data that crosses from the model runner into attention ops.

nano-vllm passes this through an untyped module-global context; here it is a frozen
dataclass handed to the model's forward, carrying exactly the index tensors whose
dtypes broke vLLM, at the widths the contracts pin.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

import torch


@dataclass(frozen=True)
class AttentionMetadata:
    """One step's varlen batch layout, as paged_attention and mla_attention read it.

    Sequence b owns query rows `query_start_loc[b]:query_start_loc[b+1]` and has
    `seq_lens[b]` cached tokens once this step's keys are written; `slot_mapping[t]`
    is the flat cache slot (block * block_size + offset) where token t's key goes, -1
    for padding. `block_tables`, `seq_lens` and `query_start_loc` share one index
    dtype (the contracts' dtype group); `slot_mapping` may differ.
    """

    slot_mapping: torch.Tensor
    block_tables: torch.Tensor
    seq_lens: torch.Tensor
    query_start_loc: torch.Tensor
    max_query_len: int
    max_seq_len: int

    @property
    def num_tokens(self) -> int:
        return int(self.slot_mapping.shape[0])

    @property
    def num_seqs(self) -> int:
        return int(self.seq_lens.shape[0])


@dataclass(frozen=True)
class KVCacheSpec:
    """What one attention layer stores per token, so the runner can size and allocate
    caches: `gqa` keeps separate key and value caches of (num_kv_heads, head_size);
    `mla` keeps one latent cache of `head_size` = kv_lora_rank + rope dim per token."""

    kind: Literal["gqa", "mla"]
    num_kv_heads: int
    head_size: int

    def bytes_per_token(self, dtype: torch.dtype) -> int:
        """Cache bytes one token costs in this layer."""
        per_tensor = self.num_kv_heads * self.head_size * torch.empty((), dtype=dtype).element_size()
        return per_tensor * (2 if self.kind == "gqa" else 1)


#: One layer's cache: (key_cache, value_cache) for gqa, (latent_cache,) for mla.
LayerKVCache = tuple[torch.Tensor, ...]
