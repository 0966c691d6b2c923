"""Owns the device side of one rank: KV cache sizing and allocation, the profile run,
the persistent batch, and one forward per step over a flattened varlen batch, then
sampling.

A step arrives as a plain `SchedulerOutput`; the runner applies its diffs to the
persistent batch and gathers the step's inputs from it with vectorised indexing into
persistent buffers (`StepInputs`): new tokens back to back, with the typed
AttentionMetadata (int32 index tensors, as the contracts pin them). On a backend whose
graph capture is real (CUDA graphs), pure-decode steps replay the decode step captured
per batch-size bucket after the KV cache is allocated (`DecodeGraphs`); every other step
runs eagerly. Logits are computed only for rows that sample (and prompt rows
whose logprobs were asked for). Every tensor-parallel rank samples the same tokens
from the same gathered logits; only the driver reports them.
"""

from __future__ import annotations

import dataclasses
import logging
import time
from collections.abc import Mapping
from typing import Any

import numpy as np
import torch

from ...op_contracts import FP8_DTYPES, FP8_MAX, OpDispatcher
from . import kv_calibration
from .attention import AttentionMetadata, KVCacheSpec, LayerKVCache
from .compilation import compile_forward
from ..config import DEFAULT_CPU_KV_CACHE_BYTES, EngineConfig
from ..device import DeviceBackend
from ..distributed import ParallelContext
from .graph_capture import DecodeGraphs, InputSpec, capture_sizes
from .input_batch import CachedRequestState, InputBatch
from ..kv_transfer.base import KVConnectorWorker
from ..kv_transfer.factory import make_worker_connector
from ..models import CausalLM
from ..lora.slots import LoRASlots
from ..models.layers.mlp import worst_case_expert_load
from .rejection_sampler import RejectionSampler
from .sampler import SampledTokens, Sampler, prompt_logprobs
from ..sched.output import ModelRunnerOutput, SchedulerOutput
from ..spec_decode.proposers import Proposer, make_proposer, speculates
from .drafting import DraftHead, ModelDrafter, make_drafter
from .drafting.base import TargetStep
from .step_inputs import INDEX_DTYPE, FlatBatch, StepInputs
from ..structured_output import GrammarBitmask

logger = logging.getLogger(__name__)

#: Seconds a step with nothing to compute waits for a running KV load to end (the
#: engine steps while loads run, so this is how often it looks, and the most a request
#: that arrives meanwhile waits for its first step).
LOAD_POLL_S = 0.005


def _with_transfers(output: ModelRunnerOutput | None, connector: KVConnectorWorker) -> ModelRunnerOutput | None:
    """`output` with the transfers `connector` reports ended since the last step (the
    remote reads, the asynchronous loads done and failed); None when none and no output."""
    sending, recving = connector.get_finished()
    failed = connector.get_load_errors()
    if not (sending or recving or failed):
        return output
    output = output if output is not None else ModelRunnerOutput()
    output.kv_finished_sending, output.kv_finished_recving, output.kv_failed_recving = sending, recving, failed
    return output


class ModelRunner:
    """Runs the model for the scheduler's steps on one backend's device."""

    def __init__(
        self,
        config: EngineConfig,
        backend: DeviceBackend,
        ops: OpDispatcher,
        model: CausalLM,
        model_dtype: torch.dtype,
        max_model_len: int,
        is_driver: bool = True,
        rank: int = 0,
        parallel: ParallelContext | None = None,
        drafting_model: CausalLM | DraftHead | None = None,
    ) -> None:
        self.config = config
        self.backend = backend
        self.device = backend.device()
        self.model = model
        #: The LoRA adapters' device slots (None: LoRA off); put in the model before
        #: the forward is compiled, so a compiled forward calls the LoRA hook too.
        self.lora: LoRASlots | None = (
            LoRASlots(model, ops, config.max_loras, config.max_lora_rank, config.lora_cpu_cache_size, parallel)
            if config.enable_lora else None
        )
        # The forward every step runs: compiled when -O asks (accord.core.worker.compilation).
        self.forward = compile_forward(model, ops) if config.compilation_config else model.forward
        self.max_model_len = max_model_len
        self.block_size = config.block_size
        self.is_driver = is_driver
        self.specs: list[KVCacheSpec] = model.kv_cache_specs()
        self.model_dtype = model_dtype
        self.kv_cache_dtype = backend.fp8_dtype() if config.kv_cache_dtype != "auto" else model_dtype
        self.kv_caches: list[LayerKVCache] = []
        self.sampler = Sampler(ops, seed=config.seed)
        self.rejection_sampler = RejectionSampler(ops, self.sampler.rng)
        max_blocks = -(-max_model_len // self.block_size)
        self.input_batch = InputBatch(config.max_num_seqs, max_model_len, max_blocks)
        max_tokens = max(config.max_num_batched_tokens or 0, max_model_len, config.max_num_seqs)
        self.step_inputs = StepInputs(config.max_num_seqs, max_tokens, max_blocks, self.block_size, self.device)
        #: Drafts the next steps' tokens from each request's tokens (speculative decoding;
        #: None: off), or with a model (`drafter`: a draft model or an MTP layer, which the
        #: worker loads on the driver as `drafting_model`). Only the driver's proposals are
        #: used: the scheduler hands them to every rank.
        speculative = config.speculative
        self.proposer: Proposer | None = (
            make_proposer(speculative) if speculative is not None and is_driver and drafting_model is None else None
        )
        self.drafter: ModelDrafter | None = None
        if drafting_model is not None:
            assert speculative is not None, "a drafting model without a speculative_config"
            drafter_inputs = StepInputs(config.max_num_seqs, max_tokens, max_blocks, self.block_size, self.device)
            self.drafter = make_drafter(speculative, drafting_model, drafter_inputs, self.sampler.rng)
        #: The distributions the draft model drew the last proposals from, by request.
        self._draft_probs: dict[str, torch.Tensor | None] = {}
        #: The last step's target features the drafter reads (EAGLE-3; None: its hidden states).
        self._features: torch.Tensor | None = None
        #: The captured decode steps (None: every step runs eagerly).
        self.decode_graphs: DecodeGraphs | None = None
        # The last step's token counts, kept so a failed step can be re-run in parts.
        self._last_step: dict[str, int] = {}
        self._grammar_bitmask: GrammarBitmask | None = None
        self._drafts: dict[str, list[int]] = {}
        #: The requests whose drafts the next step may check (None: all; adaptive speculation).
        self._propose_for: frozenset[str] | None = None
        #: The worker half of a KV connector (None: no KV comes from or goes outside).
        self.kv_connector: KVConnectorWorker | None = (
            None if config.kv_transfer is None
            else make_worker_connector(config.kv_transfer, self.block_size, rank, ops)
        )

    # -- KV cache ------------------------------------------------------------------
    @property
    def bytes_per_block(self) -> int:
        """KV bytes one block costs across all layers (on this rank), a draft model's included."""
        specs = self.specs + (self.drafter.specs if self.drafter is not None else [])
        return self.block_size * sum(spec.bytes_per_token(self.kv_cache_dtype) for spec in specs)

    def initialize_cache(self, num_blocks: int) -> Any:
        """Allocate the KV cache for serving, then capture the decode graphs over it;
        returns the KV connector's handshake metadata (None without one)."""
        self.allocate_kv_cache(num_blocks)
        if self.drafter is not None:
            self._allocate_drafter_cache(num_blocks)
        if self.kv_connector is not None:
            self.kv_connector.register_kv_caches(self.kv_caches)
        self.capture_decode_graphs()
        return None if self.kv_connector is None else self.kv_connector.handshake_metadata()

    def allocate_kv_cache(self, num_blocks: int, dtype: torch.dtype | None = None) -> None:
        """Allocate every layer's cache with `num_blocks` blocks, in the backend's layout
        (of `dtype`, by default the KV cache dtype)."""
        self.kv_caches = [self._layer_cache(spec, num_blocks, dtype) for spec in self.specs]

    def _allocate_drafter_cache(self, num_blocks: int, dtype: torch.dtype | None = None) -> None:
        """Allocate the drafter's layers' caches over the same `num_blocks` blocks."""
        self.drafter.kv_caches = [self._layer_cache(spec, num_blocks, dtype) for spec in self.drafter.specs]  # type: ignore[union-attr]

    def _layer_cache(self, spec: KVCacheSpec, num_blocks: int, dtype: torch.dtype | None = None) -> LayerKVCache:
        dtype, device = dtype or self.kv_cache_dtype, self.device
        # Host caches are not zeroed: zeroing the CPU default of 4 GiB cost seconds of
        # start-up and committed all of it at once, while an allocation that size is
        # mapped fresh from the OS (zero pages, touched only as blocks are used), and the
        # kernels already read past a sequence's slots only under a mask (a reused block
        # holds a finished request's keys). Device memory is zeroed: it costs nothing there.
        alloc = torch.empty if device.type == "cpu" else torch.zeros
        if spec.kind == "mla":
            return (alloc(num_blocks, self.block_size, spec.head_size, dtype=dtype, device=device),)
        shape = self.backend.kv_cache_shape(num_blocks, self.block_size, spec.num_kv_heads, spec.head_size)
        return (alloc(shape, dtype=dtype, device=device), alloc(shape, dtype=dtype, device=device))

    def num_blocks_for_budget(self) -> int:
        """Blocks this rank's KV budget holds: `kv_cache_memory` bytes if given (and on
        CPUs a default), else `gpu_memory_utilization` of device memory minus what is in
        use. Call after profile_run so the peak activations are already accounted for."""
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

    # -- profile run and step timing ------------------------------------------------
    def profile_run(self, max_num_seqs: int, max_num_batched_tokens: int) -> None:
        """Run one forward at the configured maxima (the largest batch a step can hold,
        split over as many sequences as it may have, with logits for each) on a scratch
        KV cache, so shape and dtype problems show before the first request and the
        allocator's peak is known before the KV cache is sized. The routed experts take
        this rank's worst case: every token reaches this rank's experts (an
        expert-parallel rank's heaviest step), whatever the router makes of the batch.
        A drafter (draft model, MTP or EAGLE head) runs its heaviest forward after it, as
        every step runs it after the target's: over the same tokens, while the target's
        hidden states and logits are held (its KV bytes are in `bytes_per_block`)."""
        num_seqs = max(1, min(max_num_seqs, max_num_batched_tokens))
        lengths = [max_num_batched_tokens // num_seqs] * num_seqs
        lengths[-1] += max_num_batched_tokens - sum(lengths)
        self._scratch_forward(lengths, with_drafter=True)

    def time_step(self, num_tokens: int) -> float:
        """Seconds of a step computing `num_tokens` new tokens (one prompt chunk, split
        over sequences only where it exceeds max_model_len; one token is a decode step)
        with the logits of each sequence, on a scratch KV cache."""
        lengths = [self.max_model_len] * (num_tokens // self.max_model_len)
        if num_tokens % self.max_model_len:
            lengths.append(num_tokens % self.max_model_len)
        return self._scratch_forward(lengths)

    def calibrate_kv_scales(self) -> None:
        """Give each attention layer of an fp8 cache without the checkpoint's scales
        amax / fp8_max of the keys and values of one forward over seeded random tokens,
        computed on an unquantised scratch cache (accord.core.worker.kv_calibration)."""
        layers = kv_calibration.gqa_layers(self.model.layers)
        if self.kv_cache_dtype not in FP8_DTYPES or not kv_calibration.needs_calibration(layers):
            return
        tokens = kv_calibration.calibration_tokens(self.model.config.vocab_size, self.max_model_len)
        with kv_calibration.calibrating(layers, FP8_MAX[self.kv_cache_dtype]):
            self._scratch_forward([tokens.shape[1]], tokens.numpy(), self.model_dtype)
        logger.info(
            "fp8 KV cache scales calibrated on %d random tokens: k %s, v %s", tokens.shape[1],
            [round(layer.kv_scales.k_scale, 4) for layer in layers],
            [round(layer.kv_scales.v_scale, 4) for layer in layers],
        )

    def _scratch_forward(
        self, lengths: list[int], token_ids: np.ndarray | None = None, cache_dtype: torch.dtype | None = None,
        with_drafter: bool = False,
    ) -> float:
        """Seconds of one synchronised forward (and logits of each sequence's last row)
        of fresh sequences of these lengths (of `token_ids` [S, max length], zeros by
        default), then, `with_drafter`, the drafter's forward over the same tokens
        (`ModelDrafter.profile`), on a scratch KV cache (of `cache_dtype`) freed afterwards."""
        lengths = [min(max(1, n), self.max_model_len) for n in lengths]
        num_seqs = len(lengths)
        blocks_per_seq = -(-max(lengths) // self.block_size)
        self.allocate_kv_cache(num_seqs * blocks_per_seq, cache_dtype)
        drafter = self.drafter if with_drafter else None
        if drafter is not None:
            self._allocate_drafter_cache(num_seqs * blocks_per_seq, cache_dtype)
        tokens = np.zeros((num_seqs, max(lengths)), dtype=np.int32) if token_ids is None else token_ids
        tables = np.arange(num_seqs * blocks_per_seq).reshape(num_seqs, blocks_per_seq)
        num_new = np.array(lengths, dtype=np.int64)
        start = time.perf_counter()
        rows = np.arange(num_seqs)
        batch = self.step_inputs.flatten(tokens, tables, rows, np.zeros(num_seqs, dtype=np.int64), num_new)
        moe_blocks = self.model.moe_blocks() + (drafter.moe_blocks() if drafter is not None else [])
        # An EAGLE-3 drafter reads the target's features, which only the feature forward keeps.
        reads_features = drafter is not None and bool(drafter.feature_layers)
        with torch.inference_mode(), worst_case_expert_load(moe_blocks):
            if reads_features:
                hidden = self._forward_features(batch)
            else:
                hidden = self.forward(batch.input_ids, batch.positions, batch.attn, self.kv_caches)
            last_rows = torch.from_numpy(batch.last_rows).to(hidden.device)
            logits = self.model.compute_logits(hidden[last_rows])
            if drafter is not None:
                # A step holds its logits while the drafter runs (`run`): so does the profile.
                drafter.profile(batch, self._features if reads_features else hidden, last_rows)
            del logits
        self.backend.synchronize()
        seconds = time.perf_counter() - start
        self.kv_caches, self._features = [], None
        if drafter is not None:
            drafter.kv_caches = []
        return seconds

    # -- decode graphs ---------------------------------------------------------------
    def capture_decode_graphs(self) -> None:
        """Capture the decode step for every batch-size bucket over the allocated KV
        cache, when the backend's capture is real and --enforce-eager is off. The first
        (warm-up) run of each bucket validates its contract calls; a bucket the backend
        cannot capture (a host sync inside its step, say) runs eagerly."""
        self.decode_graphs = None
        if self.config.enforce_eager or not self.backend.captures_graphs:
            return
        if self.config.compilation_config and not self.backend.captures_compiled_steps:
            logger.info("no decode graphs: backend %s does not record a compiled step (-O%d)",
                        self.backend.name, self.config.compilation_config)
            return
        # Padding rows read block 0's first slot. A host cache is not zeroed (see
        # _layer_cache) and may be reused memory, so block 0 is: the warm-up run of a
        # capture must not feed garbage through the padding rows (into the op calls the
        # gate records, say). Every contract cache is [NB, ...].
        for cache in self.kv_caches:
            for tensor in cache:
                tensor[0].zero_()
        max_blocks = self.input_batch.block_table.shape[1]
        inputs = {
            "input_ids": InputSpec((), torch.int64, 0),
            "positions": InputSpec((), torch.int64, 0),
            # Padding rows write no KV (slot -1) and attend to one key of block 0, so
            # every kernel sees a well-formed sequence; their outputs are dropped.
            "slot_mapping": InputSpec((), INDEX_DTYPE, -1),
            "block_tables": InputSpec((max_blocks,), INDEX_DTYPE, 0),
            "seq_lens": InputSpec((), INDEX_DTYPE, 1),
        }
        if self.lora is not None:
            # Each row's adapter slot is an input like the others, so a replay reads the
            # step's slots (padding rows: -1, the base model).
            inputs["lora_slot_ids"] = InputSpec((), INDEX_DTYPE, -1)
        largest, limit = self.config.cudagraph_capture_size, self.backend.max_graph_batch
        largest = largest if limit is None else min(largest, limit)
        self._decode_query_start_loc = torch.arange(largest + 1, dtype=INDEX_DTYPE, device=self.device)
        graphs = DecodeGraphs(self.backend, self._decode_step, inputs, capture_sizes(largest), self.device)
        with torch.inference_mode():
            graphs.capture()
        for size, error in sorted(graphs.refused.items()):
            # A backend declining a step it cannot record is expected (INFO); a capture
            # that failed otherwise is not.
            level = logging.INFO if isinstance(error, NotImplementedError) else logging.WARNING
            logger.log(level, "decode graph for batch %d not captured, its steps run eagerly: %s: %s",
                       size, type(error).__name__, error)
        if graphs.captured:
            logger.info("decode graphs captured for batches %s", graphs.captured)
            self.decode_graphs = graphs

    def _decode_step(self, inputs: Mapping[str, torch.Tensor]) -> torch.Tensor:
        """The hidden states of one token per sequence over the graphs' buffers. The
        attention bound is max_model_len, fixed at capture (kernels mask by seq_lens)."""
        num_seqs = inputs["input_ids"].shape[0]
        attn = AttentionMetadata(
            slot_mapping=inputs["slot_mapping"],
            block_tables=inputs["block_tables"],
            seq_lens=inputs["seq_lens"],
            query_start_loc=self._decode_query_start_loc[: num_seqs + 1],
            max_query_len=1,
            max_seq_len=self.max_model_len,
        )
        if self.lora is None:
            return self.forward(inputs["input_ids"], inputs["positions"], attn, self.kv_caches)
        return self._lora_forward(inputs["lora_slot_ids"], inputs["input_ids"], inputs["positions"], attn)

    def _lora_forward(
        self, slot_ids: torch.Tensor | None, input_ids: torch.Tensor, positions: torch.Tensor, attn: AttentionMetadata
    ) -> torch.Tensor:
        """The forward with each token's LoRA slot in `slot_ids` (None: no adapter)."""
        self.lora.batch.slot_ids = slot_ids
        try:
            return self.forward(input_ids, positions, attn, self.kv_caches)
        finally:
            # Forwards outside a step (profile, dummy batches) run the base model.
            self.lora.batch.slot_ids = None

    def _forward(
        self, rows: np.ndarray, num_computed: np.ndarray, num_new: np.ndarray, lora_slots: np.ndarray | None = None
    ) -> tuple[torch.Tensor, FlatBatch]:
        """Hidden states of the step's new tokens: a captured graph's replay for a
        pure-decode step whose bucket was captured, else an eager forward (with each
        request's LoRA slot in `lora_slots` when LoRA is on). When the drafter reads the
        target's features (EAGLE-3), they are kept in `self._features`."""
        batch, graphs = self.input_batch, self.decode_graphs
        feature_layers = self.drafter.feature_layers if self.drafter is not None else ()
        decode = (graphs is not None and not feature_layers and int(num_new.max()) == 1
                  and graphs.replays_batch(len(num_new)))
        flat = self.step_inputs.flatten(batch.token_ids_np, batch.block_table_np, rows, num_computed, num_new,
                                        full_width=decode, lora_slots=lora_slots)
        if feature_layers:
            return self._forward_features(flat), flat
        if decode:
            inputs = {"input_ids": flat.input_ids, "positions": flat.positions, "slot_mapping": flat.attn.slot_mapping,
                      "block_tables": flat.attn.block_tables, "seq_lens": flat.attn.seq_lens}
            if self.lora is not None:
                inputs["lora_slot_ids"] = torch.from_numpy(lora_slots).to(self.device)
            return graphs.run(inputs), flat
        if self.lora is None:
            return self.forward(flat.input_ids, flat.positions, flat.attn, self.kv_caches), flat
        return self._lora_forward(flat.lora_slot_ids, flat.input_ids, flat.positions, flat.attn), flat

    def _forward_features(self, flat: FlatBatch) -> torch.Tensor:
        """The hidden states of an eager forward of `flat` that also keeps the residual
        stream entering the drafter's feature layers (EAGLE-3), concatenated, in
        `self._features` (with each token's LoRA slot, when LoRA is on)."""
        if self.lora is not None:
            self.lora.batch.slot_ids = flat.lora_slot_ids
        try:
            hidden, features = self.model.forward_features(flat.input_ids, flat.positions, flat.attn,
                                                           self.kv_caches, self.drafter.feature_layers)  # type: ignore[union-attr]
        finally:
            if self.lora is not None:
                self.lora.batch.slot_ids = None
        self._features = torch.cat(features, dim=-1)
        return hidden

    # -- a step --------------------------------------------------------------------
    def update_states(self, step: SchedulerOutput) -> None:
        """Apply a step's diffs to the persistent batch: drop ended and preempted
        requests, add new ones, extend block tables and computed counts."""
        batch = self.input_batch
        for req_id in step.finished_req_ids | step.preempted_req_ids:
            batch.remove(req_id)
            self._draft_probs.pop(req_id, None)
            if self.proposer is not None:
                self.proposer.forget(req_id)
        for new in step.scheduled_new_reqs:
            batch.add(new)
            if new.lora_request is not None and self.lora is not None:
                self.lora.register(new.lora_request)
        batch.update(step.scheduled_cached_reqs)
        if self.lora is not None:
            self.lora.unload(step.unloaded_lora_ids, {state.lora_int_id for state in batch.requests.values()})

    def execute_model(self, step: SchedulerOutput) -> ModelRunnerOutput | None:
        """Apply the step to the persistent batch and run it; the driver returns the
        results (None elsewhere, and for a step with nothing to compute)."""
        self.update_states(step)
        self._last_step = dict(step.num_scheduled_tokens)
        self._grammar_bitmask = step.grammar_bitmask
        self._drafts = step.scheduled_spec_decode_tokens
        self._propose_for = step.propose_for_req_ids
        connector = self.kv_connector
        if step.is_empty:
            if step.dummy_batch:
                self.dummy_run()
            if connector is None:
                return None
            if step.kv_connector_metadata:
                # Notifications or loads with nothing to compute (vLLM's no-forward connector step).
                connector.run_step(step.kv_connector_metadata, lambda: None)
            # The engine steps while loads run: wait a little for one, rather than spin.
            connector.wait_for_loads(LOAD_POLL_S)
            # An empty step still reports the reads remote instances finished, and the loads.
            return _with_transfers(None, connector)
        metadata = step.kv_connector_metadata
        if connector is None:
            return self.run(self._last_step)
        output = connector.run_step(metadata, lambda: self.run(self._last_step)) if metadata else self.run(self._last_step)
        return _with_transfers(output, connector)

    @torch.inference_mode()
    def dummy_run(self) -> None:
        """One padding token (id 0 at position 0) through the model, for its
        collectives: it writes no KV (slot -1 is skipped), reads block 0's first slot
        and samples nothing, so no request's state changes."""
        zero = np.zeros(1, dtype=np.int64)
        flat = self.step_inputs.flatten(np.zeros((1, 1), dtype=np.int32), np.zeros((1, 1), dtype=np.int32),
                                        zero, zero, np.ones(1, dtype=np.int64))
        padding = torch.full_like(flat.attn.slot_mapping, -1)
        attn = dataclasses.replace(flat.attn, slot_mapping=padding)
        self.forward(flat.input_ids, flat.positions, attn, self.kv_caches)

    def execute_subset(self, req_ids: list[str]) -> ModelRunnerOutput | None:
        """Run the last step again for only `req_ids` (the step failed and the engine is
        finding which request made it fail; rewriting a request's KV is harmless). A
        request whose KV the connector failed to load fails again: its blocks hold none."""
        failed_loads = self.kv_connector.failed_loads if self.kv_connector is not None else {}
        for req_id in req_ids:
            if req_id in failed_loads:
                raise RuntimeError(f"the KV connector could not load {req_id}'s KV: {failed_loads[req_id]}")
        return self.run({req_id: self._last_step[req_id] for req_id in req_ids})

    @torch.inference_mode()
    def run(self, num_scheduled_tokens: Mapping[str, int]) -> ModelRunnerOutput | None:
        """Forward, logits for sampling rows, sampling, for requests of the batch."""
        batch = self.input_batch
        states = [batch.requests[req_id] for req_id in num_scheduled_tokens]
        count = len(states)
        rows = np.fromiter((s.row for s in states), np.int64, count)
        num_computed = np.fromiter((s.num_computed_tokens for s in states), np.int64, count)
        num_new = np.fromiter(num_scheduled_tokens.values(), np.int64, count)
        num_tokens = np.fromiter((s.num_tokens for s in states), np.int64, count)
        drafts = [self._drafts.get(s.req_id, []) for s in states] if self._drafts else None
        num_drafts = np.zeros(count, dtype=np.int64)
        if drafts is not None:
            num_drafts = np.fromiter(map(len, drafts), np.int64, count)
            for b in np.flatnonzero(num_drafts):
                # The drafts sit after the known tokens, where the step reads its inputs.
                batch.token_ids_np[rows[b], num_tokens[b] : num_tokens[b] + num_drafts[b]] = drafts[b]
        lora_slots = self.lora.slots_for([s.lora_int_id for s in states]) if self.lora is not None else None
        hidden, flat = self._forward(rows, num_computed, num_new, lora_slots)
        samplers = np.flatnonzero(num_computed + num_new == num_tokens + num_drafts)
        prompt_entries = self._prompt_logprobs(states, num_computed, num_new, flat, hidden)
        output = ModelRunnerOutput(prompt_logprobs={states[b].req_id: entries for b, entries in prompt_entries})
        if len(samplers) and drafts is not None and num_drafts[samplers].any():
            self._check_drafts(output, [states[b] for b in samplers], [drafts[b] for b in samplers],
                               flat.last_rows[samplers], hidden)
        elif len(samplers):
            # Every row a sampler's last (a decode step): the hidden states as they are.
            if len(samplers) == len(hidden):
                sampling, sampled_rows = states, hidden
            else:
                sampling = [states[b] for b in samplers]
                sampled_rows = hidden[torch.from_numpy(flat.last_rows[samplers])]
                rows, num_tokens = rows[samplers], num_tokens[samplers]
            logits = self.model.compute_logits(sampled_rows)
            sampled = self.sampler(logits, sampling, self._grammar_bitmask)
            output.req_ids = [s.req_id for s in sampling]
            output.sampled_token_ids = sampled.token_ids
            output.logprobs = sampled.logprobs
            output.top_logprobs = sampled.top_logprobs
            batch.append_tokens(sampling, rows, num_tokens, output.sampled_token_ids)
        if self.drafter is not None:
            # Every step: the drafter's KV follows the target's, prompt chunks included.
            features = hidden if self._features is None else self._features
            step = TargetStep(flat, features, states, num_computed, num_new)
            output.draft_token_ids = self._propose_with_model(step, [states[b] for b in samplers])
        elif self.proposer is not None and len(samplers):
            output.draft_token_ids = self._propose([states[b] for b in samplers])
        # State changes only once nothing can fail any more.
        for b, entries in prompt_entries:
            states[b].num_prompt_logprobs_done += len(entries)
        return output if self.is_driver else None

    def _check_drafts(
        self,
        output: ModelRunnerOutput,
        sampling: list[CachedRequestState],
        drafts: list[list[int]],
        last_rows: np.ndarray,
        hidden: torch.Tensor,
    ) -> None:
        """Sample a step where some requests checked drafts: those through the rejection
        sampler (logits at each draft and after the last), the others through the sampler;
        every request's tokens go into `output` in batch order and into the batch."""
        checked = [b for b, draft in enumerate(drafts) if draft]
        plain = [b for b, draft in enumerate(drafts) if not draft]
        logit_rows = np.concatenate(
            [np.arange(last_rows[b] - len(drafts[b]), last_rows[b] + 1) for b in checked] + [last_rows[plain]]
        )
        logits = self.model.compute_logits(hidden[torch.from_numpy(logit_rows)])
        num_checked_rows = len(logit_rows) - len(plain)
        results: dict[int, SampledTokens] = dict(zip(
            checked,
            self.rejection_sampler(logits[:num_checked_rows], [sampling[b] for b in checked], [drafts[b] for b in checked],
                                   self._checked_draft_probs([sampling[b] for b in checked], [drafts[b] for b in checked])),
        ))
        if plain:
            sampled = self.sampler(logits[num_checked_rows:], [sampling[b] for b in plain], self._grammar_bitmask)
            for i, b in enumerate(plain):
                results[b] = SampledTokens(sampled.token_ids[i : i + 1], sampled.logprobs[i : i + 1],
                                           sampled.top_logprobs[i : i + 1])
        states, rows, positions = [], [], []
        for b, state in enumerate(sampling):
            tokens = results[b]
            count = len(tokens.token_ids)
            output.req_ids += [state.req_id] * count
            output.sampled_token_ids += tokens.token_ids
            output.logprobs += tokens.logprobs
            output.top_logprobs += tokens.top_logprobs
            states += [state] * count
            rows += [state.row] * count
            positions += range(state.num_tokens, state.num_tokens + count)
        self.input_batch.append_tokens(states, np.array(rows), np.array(positions), output.sampled_token_ids)

    def _checked_draft_probs(
        self, sampling: list[CachedRequestState], drafts: list[list[int]]
    ) -> list[torch.Tensor | None] | None:
        """The draft model's distributions of the drafts a step checks (cut as the
        scheduler cut the drafts); None when the drafts are not a model's."""
        if self.drafter is None:
            return None
        probs = [self._draft_probs.get(state.req_id) for state in sampling]
        return [None if p is None else p[: len(draft)] for p, draft in zip(probs, drafts)]

    def _propose_with_model(self, step: TargetStep, sampling: list[CachedRequestState]) -> dict[str, list[int]]:
        """The drafter's drafts for the requests that sampled this step and take proposals
        (it reads the step whether or not any do)."""
        speculating = [state for state in sampling if self._takes_drafts(state)]
        drafts = self.drafter.propose(step, speculating, self.input_batch, self.block_size)  # type: ignore[union-attr]
        # A request that sampled has checked its last drafts; a request the scheduler
        # left out of a step keeps its drafts, and their distributions, for a later one.
        for state in sampling:
            self._draft_probs.pop(state.req_id, None)
        self._draft_probs.update((req_id, draft.probs) for req_id, draft in drafts.items())
        return {req_id: draft.token_ids for req_id, draft in drafts.items()}

    def _takes_drafts(self, state: CachedRequestState) -> bool:
        """Whether to draft for `state`: it takes drafts, the batch is below
        disable_by_batch_size and adaptive speculation has it among the requests worth
        proposing for (else the next step would not check them: drafting them, a draft
        model's k forwards or a suffix walk, would be wasted)."""
        limit = self.config.speculative.disable_by_batch_size  # type: ignore[union-attr]
        return ((limit is None or len(self.input_batch.requests) < limit)
                and (self._propose_for is None or state.req_id in self._propose_for)
                and speculates(state.params, state.num_output_tokens))

    def _propose(self, sampling: list[CachedRequestState]) -> dict[str, list[int]]:
        """The drafts of the requests that sampled this step and take proposals."""
        proposals = {}
        tokens = self.input_batch.token_ids_np
        for state in sampling:
            if not self._takes_drafts(state):
                continue
            draft = self.proposer.propose(tokens[state.row, : state.num_tokens], state.req_id)  # type: ignore[union-attr]
            if draft:
                proposals[state.req_id] = draft
        return proposals

    def _prompt_logprobs(
        self,
        states: list[CachedRequestState],
        num_computed: np.ndarray,
        num_new: np.ndarray,
        flat: FlatBatch,
        hidden: torch.Tensor,
    ) -> list[tuple[int, list]]:
        """Logprobs of the prompt tokens this step's rows predict, for requests that
        asked and have not had them yet (a recompute after preemption skips them)."""
        results: list[tuple[int, list]] = []
        if not any(state.needs_prompt_logprobs for state in states):
            return results
        starts, counts, last_rows = num_computed.tolist(), num_new.tolist(), flat.last_rows.tolist()
        for b, state in enumerate(states):
            if not state.needs_prompt_logprobs:
                continue
            # The row at position p predicts prompt token p + 1 (entry p + 1); the last
            # prompt row samples instead. Rows already done before a preemption are skipped.
            first = max(starts[b], state.num_prompt_logprobs_done - 1)
            end = min(starts[b] + counts[b], state.num_prompt_tokens - 1)
            if end <= first:
                continue
            first_row = last_rows[b] - counts[b] + 1 + first - starts[b]
            logits = self.model.compute_logits(hidden[first_row : first_row + end - first])
            targets = state.prompt_token_ids[first + 1 : end + 1]
            results.append((b, prompt_logprobs(logits, targets, state.num_prompt_logprobs or 0)))
        return results
