"""Owns the device side: KV cache sizing and allocation, the profile run, and one
forward per step over a flattened varlen batch, then sampling.

A step's sequences become one batch: their new tokens back to back, with the typed
AttentionMetadata (int32 index tensors, as the contracts pin them). Logits are computed
only for rows that sample (and prompt rows whose logprobs were asked for).
"""

from __future__ import annotations

from collections.abc import Sequence as Seq
from dataclasses import dataclass
from typing import TYPE_CHECKING

import torch

from ..op_contracts import OpDispatcher
from .attention import AttentionMetadata, KVCacheSpec, LayerKVCache
from .config import DEFAULT_CPU_KV_CACHE_BYTES, EngineConfig
from .models import CausalLM
from .outputs import Logprob
from .sampler import SampledToken, Sampler, prompt_logprobs
from .scheduler import SchedulerOutput
from .sequence import Sequence

if TYPE_CHECKING:
    from ..backends.base import Backend

INDEX_DTYPE = torch.int32


@dataclass(frozen=True)
class RunnerOutput:
    """A step's results: sampled tokens of the sequences that reached their end, and
    the prompt logprobs computed this step."""

    sampled: list[tuple[Sequence, SampledToken]]
    prompt_logprobs: list[tuple[Sequence, list[dict[int, Logprob]]]]


@dataclass(frozen=True)
class FlatBatch:
    """One step flattened: model inputs, attention metadata, and where rows sit."""

    input_ids: torch.Tensor
    positions: torch.Tensor
    attn: AttentionMetadata
    #: Row index of each sequence's last new token.
    last_rows: list[int]


class ModelRunner:
    """Runs the model for the scheduler's steps on one backend's device."""

    def __init__(
        self,
        config: EngineConfig,
        backend: Backend,
        ops: OpDispatcher,
        model: CausalLM,
        model_dtype: torch.dtype,
        max_model_len: int,
    ) -> None:
        self.config = config
        self.backend = backend
        self.device = backend.device()
        self.model = model
        self.max_model_len = max_model_len
        self.block_size = config.block_size
        self.specs: list[KVCacheSpec] = model.kv_cache_specs()
        self.kv_cache_dtype = backend.fp8_dtype() if config.kv_cache_dtype == "fp8" else model_dtype
        self.kv_caches: list[LayerKVCache] = []
        self.sampler = Sampler(ops, seed=config.seed)

    # -- KV cache ------------------------------------------------------------------
    @property
    def bytes_per_block(self) -> int:
        """KV bytes one block costs across all layers."""
        return self.block_size * sum(spec.bytes_per_token(self.kv_cache_dtype) for spec in self.specs)

    def allocate_kv_cache(self, num_blocks: int) -> None:
        """Allocate every layer's cache with `num_blocks` blocks, in the backend's layout."""
        self.kv_caches = [self._layer_cache(spec, num_blocks) for spec in self.specs]

    def _layer_cache(self, spec: KVCacheSpec, num_blocks: int) -> LayerKVCache:
        dtype, device = self.kv_cache_dtype, self.device
        if spec.kind == "mla":
            return (torch.zeros(num_blocks, self.block_size, spec.head_size, dtype=dtype, device=device),)
        shape = self.backend.kv_cache_shape(num_blocks, self.block_size, spec.num_kv_heads, spec.head_size)
        return (torch.zeros(shape, dtype=dtype, device=device), torch.zeros(shape, dtype=dtype, device=device))

    def num_blocks_for_budget(self) -> int:
        """Blocks the KV budget holds: `kv_cache_memory` bytes if given (and on CPUs a
        default), else `gpu_memory_utilization` of device memory minus what is in use.
        Call after profile_run so the peak activations are already accounted for."""
        if self.config.num_gpu_blocks_override is not None:
            return self.config.num_gpu_blocks_override
        budget = self.config.kv_cache_memory
        if budget is None:
            if self.device.type == "cpu":
                budget = DEFAULT_CPU_KV_CACHE_BYTES
                # A default must not cost more than the engine can ever fill: every
                # sequence at max_model_len (a tiny model's 4 GiB took seconds to zero).
                blocks_per_seq = -(-self.max_model_len // self.block_size)
                budget = min(budget, self.config.max_num_seqs * blocks_per_seq * self.bytes_per_block)
            else:
                free, total = self.backend.memory_info()
                budget = int(free - total * (1.0 - self.config.gpu_memory_utilization))
        return max(0, budget // self.bytes_per_block)

    # -- profile run ---------------------------------------------------------------
    def profile_run(self, max_num_seqs: int, max_num_batched_tokens: int) -> None:
        """Run one forward at the configured maxima (the largest batch a step can hold,
        split over as many sequences as it may have, with logits for each) on a scratch
        KV cache, so shape and dtype problems show before the first request and the
        allocator's peak is known before the KV cache is sized."""
        num_seqs = max(1, min(max_num_seqs, max_num_batched_tokens))
        lengths = [max_num_batched_tokens // num_seqs] * num_seqs
        lengths[-1] += max_num_batched_tokens - sum(lengths)
        lengths = [min(max(1, n), self.max_model_len) for n in lengths]
        blocks_per_seq = [-(-n // self.block_size) for n in lengths]
        self.allocate_kv_cache(sum(blocks_per_seq))
        tables, first = [], 0
        for count in blocks_per_seq:
            tables.append(list(range(first, first + count)))
            first += count
        batch = self.flatten([[0] * n for n in lengths], [0] * num_seqs, lengths, tables)
        with torch.inference_mode():
            hidden = self.model.forward(batch.input_ids, batch.positions, batch.attn, self.kv_caches)
            self.model.compute_logits(hidden[batch.last_rows])
        self.backend.synchronize()
        self.kv_caches = []

    # -- a step --------------------------------------------------------------------
    def flatten(
        self,
        new_tokens: Seq[Seq[int]],
        num_computed: Seq[int],
        num_new: Seq[int],
        block_tables: Seq[Seq[int]],
    ) -> FlatBatch:
        """Build model inputs and attention metadata for sequences computing
        `num_new[b]` tokens (`new_tokens[b]`) after `num_computed[b]` cached ones."""
        device = self.device
        flat_ids: list[int] = []
        for tokens in new_tokens:
            flat_ids.extend(tokens)
        q_lens = torch.tensor(num_new, dtype=torch.int64)
        computed = torch.tensor(num_computed, dtype=torch.int64)
        query_start_loc = torch.zeros(len(num_new) + 1, dtype=torch.int64)
        torch.cumsum(q_lens, 0, out=query_start_loc[1:])
        num_tokens = int(query_start_loc[-1])
        row_seq = torch.repeat_interleave(torch.arange(len(num_new)), q_lens)
        positions = torch.arange(num_tokens) - query_start_loc[row_seq] + computed[row_seq]
        width = max(len(table) for table in block_tables)
        tables = torch.tensor([list(t) + [0] * (width - len(t)) for t in block_tables], dtype=torch.int64)
        slots = tables[row_seq, positions // self.block_size] * self.block_size + positions % self.block_size
        seq_lens = computed + q_lens
        attn = AttentionMetadata(
            slot_mapping=slots.to(device=device, dtype=INDEX_DTYPE),
            block_tables=tables.to(device=device, dtype=INDEX_DTYPE),
            seq_lens=seq_lens.to(device=device, dtype=INDEX_DTYPE),
            query_start_loc=query_start_loc.to(device=device, dtype=INDEX_DTYPE),
            max_query_len=max(num_new),
            max_seq_len=int(seq_lens.max()),
        )
        return FlatBatch(
            input_ids=torch.tensor(flat_ids, dtype=torch.int64, device=device),
            positions=positions.to(device),
            attn=attn,
            last_rows=(query_start_loc[1:] - 1).tolist(),
        )

    @torch.inference_mode()
    def execute(self, step: SchedulerOutput, block_tables: Seq[Seq[int]]) -> RunnerOutput:
        """Run one scheduled step: forward, logits for sampling rows, sampling."""
        seqs = step.sequences
        counts = [step.num_scheduled_tokens[seq.seq_id] for seq in seqs]
        starts = [seq.num_computed_tokens for seq in seqs]
        batch = self.flatten(
            [seq.token_ids[c : c + n] for seq, c, n in zip(seqs, starts, counts)], starts, counts, block_tables
        )
        hidden = self.model.forward(batch.input_ids, batch.positions, batch.attn, self.kv_caches)
        samplers = [b for b, seq in enumerate(seqs) if starts[b] + counts[b] == seq.num_tokens]
        sampled: list[tuple[Sequence, SampledToken]] = []
        if samplers:
            logits = self.model.compute_logits(hidden[[batch.last_rows[b] for b in samplers]])
            sampling_seqs = [seqs[b] for b in samplers]
            sampled = list(zip(sampling_seqs, self.sampler(logits, sampling_seqs, step.grammar_bitmask)))
        return RunnerOutput(sampled, self._prompt_logprobs(seqs, starts, counts, batch, hidden))

    def _prompt_logprobs(
        self, seqs: list[Sequence], starts: list[int], counts: list[int], batch: FlatBatch, hidden: torch.Tensor
    ) -> list[tuple[Sequence, list[dict[int, Logprob]]]]:
        """Logprobs of the prompt tokens this step's rows predict, for sequences that
        asked and have not had them yet (a recompute after preemption skips them)."""
        results: list[tuple[Sequence, list[dict[int, Logprob]]]] = []
        for b, seq in enumerate(seqs):
            if not seq.needs_prompt_logprobs:
                continue
            # The row at position p predicts prompt token p + 1 (entry p + 1); the last
            # prompt row samples instead. Rows already done before a preemption are skipped.
            first = max(starts[b], len(seq.prompt_logprobs) - 1)
            end = min(starts[b] + counts[b], seq.num_prompt_tokens - 1)
            if end <= first:
                continue
            first_row = batch.last_rows[b] - counts[b] + 1 + first - starts[b]
            logits = self.model.compute_logits(hidden[first_row : first_row + end - first])
            targets = seq.token_ids[first + 1 : end + 1]
            results.append((seq, prompt_logprobs(logits, targets, seq.params.prompt_logprobs or 0)))
        return results
