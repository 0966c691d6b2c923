"""The model runner's per-step inputs in persistent buffers (vLLM v1's CpuGpuBuffer
convention): token ids, positions, slot mapping, block tables, sequence lengths and
query start offsets are written each step by a few vectorised numpy operations into
host buffers allocated once, then copied to the device in one transfer each (on a
CPU the host buffer is the device tensor: nothing is copied).

A step's small index tensors cost more as separate torch ops on the host (a few
microseconds each, ~20 per step) than as numpy operations on views of one buffer.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from .attention import AttentionMetadata

#: The contracts' index dtype of the attention metadata.
INDEX_DTYPE = torch.int32


#: Shapes a buffer keeps views of (a step's block tables vary in both dimensions).
MAX_CACHED_VIEWS = 1024


@dataclass(frozen=True)
class FlatBatch:
    """One step flattened: model inputs, attention metadata, and where rows sit."""

    input_ids: torch.Tensor
    positions: torch.Tensor
    attn: AttentionMetadata
    #: Row index of each request's last new token (host numpy, int64).
    last_rows: np.ndarray
    #: Each token's LoRA adapter slot (int32, -1: the base model; None: no token of
    #: the step has an adapter).
    lora_slot_ids: torch.Tensor | None = None


class StagedBuffer:
    """A persistent 1-D host tensor, its numpy view (written in place), and the device
    tensor it is copied to (the host tensor itself on a CPU device)."""

    def __init__(self, size: int, dtype: torch.dtype, device: torch.device) -> None:
        on_host = device.type == "cpu"
        self.host = torch.zeros(size, dtype=dtype, pin_memory=not on_host and torch.cuda.is_available())
        self.np = self.host.numpy()
        self.device = self.host if on_host else torch.zeros(size, dtype=dtype, device=device)
        # (host, device) views by shape, made once: slicing a tensor costs microseconds.
        self._views: dict[tuple[int, ...], tuple[torch.Tensor, torch.Tensor]] = {}

    def __len__(self) -> int:
        return len(self.np)

    def to_device(self, *shape: int) -> torch.Tensor:
        """The leading elements as a tensor of `shape` on the device (copied there unless
        the device is the host)."""
        views = self._views.get(shape)
        if views is None:
            if len(self._views) >= MAX_CACHED_VIEWS:
                self._views.clear()
            size = int(np.prod(shape))
            host = self.host[:size].view(shape)
            # On the host the device tensor is the host tensor: one view, nothing to copy.
            views = self._views[shape] = (host, host if self.device is self.host else self.device[:size].view(shape))
        host, device = views
        return host if device is host else device.copy_(host, non_blocking=True)


class StepInputs:
    """Persistent buffers for steps of up to `max_seqs` sequences and `max_tokens` new
    tokens (both grow when a step needs more: profile and timing runs may), and the
    vectorised flattening of a step into them."""

    def __init__(self, max_seqs: int, max_tokens: int, max_blocks_per_seq: int, block_size: int,
                 device: torch.device) -> None:
        self.block_size = block_size
        self.device = device
        self.max_blocks_per_seq = max_blocks_per_seq
        #: Recorded after a step's host-to-device copies (off the host only): the host
        #: buffers are rewritten only once those copies ran, as a step that samples
        #: nothing (a prefill chunk) returns without waiting for the device.
        self._copied: torch.Event | None = None
        self._allocate(max_seqs, max_tokens)

    def _allocate(self, max_seqs: int, max_tokens: int) -> None:
        device = self.device
        self.input_ids = StagedBuffer(max_tokens, torch.int64, device)
        self.positions = StagedBuffer(max_tokens, torch.int64, device)
        self.slot_mapping = StagedBuffer(max_tokens, INDEX_DTYPE, device)
        self.block_tables = StagedBuffer(max_seqs * self.max_blocks_per_seq, INDEX_DTYPE, device)
        self.seq_lens = StagedBuffer(max_seqs, INDEX_DTYPE, device)
        self.query_start_loc = StagedBuffer(max_seqs + 1, INDEX_DTYPE, device)
        self.lora_slot_ids = StagedBuffer(max_tokens, INDEX_DTYPE, device)
        self._arange = np.arange(max(max_seqs, max_tokens) + 1, dtype=np.int64)

    def _fit(self, num_seqs: int, num_tokens: int) -> None:
        """Grow the buffers (rarely: only past the sizes given at construction)."""
        if num_seqs > len(self.seq_lens) or num_tokens > len(self.input_ids):
            self._allocate(max(num_seqs, len(self.seq_lens)), max(num_tokens, len(self.input_ids)))

    def flatten(
        self,
        token_ids: np.ndarray,
        block_table: np.ndarray,
        rows: np.ndarray,
        num_computed: np.ndarray,
        num_new: np.ndarray,
        full_width: bool = False,
        lora_slots: np.ndarray | None = None,
    ) -> FlatBatch:
        """Model inputs and attention metadata for the requests in `rows` of
        `token_ids`/`block_table` (host arrays, one row per request), each computing
        `num_new[b]` tokens after `num_computed[b]` cached ones. Block tables are as
        wide as the longest sequence needs, or `max_blocks_per_seq` with `full_width`
        (a captured graph's fixed shape). `lora_slots` gives each request's LoRA slot
        (-1: none), spread to its tokens."""
        num_seqs = len(num_new)
        seq_lens = num_computed + num_new
        max_seq_len = int(seq_lens.max())
        max_query_len = int(num_new.max())
        width = self.max_blocks_per_seq if full_width else -(-max_seq_len // self.block_size)
        num_tokens = num_seqs if max_query_len == 1 else int(num_new.sum())
        if self._copied is not None:
            self._copied.synchronize()
        self._fit(num_seqs, num_tokens)
        if max_query_len == 1:  # a decode step: one token per sequence, at its last position
            query_start_loc = self._arange[: num_seqs + 1]
            positions, seq_rows, row_seq = num_computed, rows, self._arange[:num_seqs]
            last_rows = row_seq
        else:
            query_start_loc = np.zeros(num_seqs + 1, dtype=np.int64)
            np.cumsum(num_new, out=query_start_loc[1:])
            row_seq = np.repeat(self._arange[:num_seqs], num_new)
            positions = self._arange[:num_tokens] - query_start_loc[row_seq] + num_computed[row_seq]
            seq_rows = rows[row_seq]
            last_rows = query_start_loc[1:] - 1
        self.positions.np[:num_tokens] = positions
        self.input_ids.np[:num_tokens] = token_ids[seq_rows, positions]
        # The step's tables live contiguously at the front of the buffer, `width` wide.
        tables = self.block_tables.np[: num_seqs * width].reshape(num_seqs, width)
        tables[:] = block_table[rows, :width]
        block_index, offset = np.divmod(positions, self.block_size)
        self.slot_mapping.np[:num_tokens] = tables[row_seq, block_index] * self.block_size + offset
        self.seq_lens.np[:num_seqs] = seq_lens
        self.query_start_loc.np[: num_seqs + 1] = query_start_loc

        attn = AttentionMetadata(
            slot_mapping=self.slot_mapping.to_device(num_tokens),
            block_tables=self.block_tables.to_device(num_seqs, width),
            seq_lens=self.seq_lens.to_device(num_seqs),
            query_start_loc=self.query_start_loc.to_device(num_seqs + 1),
            max_query_len=max_query_len,
            max_seq_len=max_seq_len,
        )
        lora_slot_ids = None
        if lora_slots is not None and (lora_slots >= 0).any():
            self.lora_slot_ids.np[:num_tokens] = lora_slots[row_seq]
            lora_slot_ids = self.lora_slot_ids.to_device(num_tokens)
        flat = FlatBatch(
            input_ids=self.input_ids.to_device(num_tokens),
            positions=self.positions.to_device(num_tokens),
            attn=attn,
            last_rows=last_rows,
            lora_slot_ids=lora_slot_ids,
        )
        if self.device.type != "cpu":
            self._copied = torch.Event(device=self.device)
            self._copied.record()
        return flat
