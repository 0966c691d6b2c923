"""One rank of the engine: its backend, its place in the parallel world (tensor-parallel
rank within its data-parallel replica), its shard of the model and the model runner.
Executors create workers (in this process or one process per rank) and call their
methods by name."""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Any

from ...op_contracts import OpDispatcher
from ...op_contracts.recording import CallRecorder, rank_directory
from ..config import EngineConfig
from ..device import BackendFactory
from ..distributed import ParallelContext, destroy_parallel, init_parallel
from ..model_loader.model_config import ModelConfig
from .contract_ops import refuse_batch_variant_ops, worker_contract_ops
from .model_runner import ModelRunner
from ..model_loader.load import load_model
from ..models import CausalLM
from ..models.eagle import load_eagle_head
from .drafting import DraftHead
from ..sched.output import ModelRunnerOutput, SchedulerOutput

logger = logging.getLogger("accord.worker")


@dataclass(frozen=True)
class WorkerInfo:
    """What a worker reports once its model is loaded."""

    rank: int
    backend_name: str
    model_config: ModelConfig
    max_model_len: int
    kv_cache_dtype: str
    bytes_per_block: int


class Worker:
    """Rank `rank` of `world_size`: joins torch.distributed through the backend's
    communicator (more than one rank), loads its shard of the model and runs steps."""

    def __init__(
        self,
        config: EngineConfig,
        backend_factory: BackendFactory,
        rank: int = 0,
        world_size: int = 1,
        init_method: str | None = None,
    ) -> None:
        self.config = config
        self.rank = rank
        backend = backend_factory()
        supported = backend.supported_block_sizes()
        if supported is not None and config.block_size not in supported:
            raise ValueError(f"block_size={config.block_size} is not one backend {backend.name!r} takes: {supported}")
        self.backend = backend
        if world_size > 1:
            assert init_method is not None, "several ranks need an init_method to meet at"
            self.parallel = init_parallel(
                backend, rank, world_size, config.tensor_parallel_size, init_method,  # type: ignore[arg-type]
                expert_parallel=config.enable_expert_parallel,
            )
        else:
            self.parallel = ParallelContext.single()
        if config.batch_invariant:
            refuse_batch_variant_ops(backend, worker_contract_ops(config.model, config.quantization,
                                                                  config.speculative is not None))
        self.ops = OpDispatcher(backend, compiled=bool(config.compilation_config), batch_invariant=config.batch_invariant)
        if config.record_op_calls is not None:
            # Installed before the model loads, so profile_run's calls are recorded too.
            self.ops.add_hook(CallRecorder(rank_directory(config.record_op_calls, rank)))
        speculative = config.speculative
        loaded = load_model(
            config.model,
            self.ops,
            dtype=config.dtype,
            quantization=config.quantization,
            compute_dtype=backend.compute_dtype,
            parallel=self.parallel,
            with_mtp=speculative is not None and speculative.method == "mtp",
        )
        self.model_config = loaded.config
        self.max_model_len = config.resolve_max_model_len(loaded.config.max_position_embeddings)
        self.runner = ModelRunner(
            config, backend, self.ops, loaded.model, loaded.config.dtype, self.max_model_len, self.parallel.is_driver,
            rank=rank, parallel=self.parallel,
            drafting_model=(loaded.mtp or self._load_draft(loaded.config, loaded.model)) if self.parallel.is_driver else None,
        )

    def _load_draft(self, target: ModelConfig, target_model: CausalLM) -> CausalLM | DraftHead | None:
        """speculative_config's draft model or EAGLE head (None: neither method),
        unsharded, on this rank's backend in the target's dtype; a draft model of another
        vocabulary, or a head of other sizes than the target's, is refused."""
        speculative = self.config.speculative
        if speculative is not None and speculative.method in ("eagle", "eagle3"):
            return load_eagle_head(speculative.method, speculative.model, self.ops, target.dtype,  # type: ignore[arg-type]
                                   target_model, target)
        if speculative is None or speculative.method != "draft_model":
            return None
        draft = load_model(speculative.model, self.ops, dtype=target.dtype, compute_dtype=self.backend.compute_dtype)  # type: ignore[arg-type]
        if draft.config.vocab_size != target.vocab_size:
            raise ValueError(
                f"speculative_config.model {speculative.model!r} has a vocabulary of {draft.config.vocab_size} tokens, "
                f"the target {self.config.model!r} one of {target.vocab_size}: a draft model must share the target's"
            )
        return draft.model

    def info(self) -> WorkerInfo:
        """This rank's backend, model config, context length and KV block cost."""
        return WorkerInfo(
            rank=self.rank,
            backend_name=self.backend.name,
            model_config=self.model_config,
            max_model_len=self.max_model_len,
            kv_cache_dtype=str(self.runner.kv_cache_dtype).removeprefix("torch."),
            bytes_per_block=self.runner.bytes_per_block,
        )

    def time_step(self, num_tokens: int) -> float:
        """Seconds of a step computing `num_tokens` new tokens on this rank (the engine
        chooses the default token budget from these; every rank runs the same steps)."""
        return self.runner.time_step(num_tokens)

    def determine_num_blocks(self, max_num_batched_tokens: int) -> int:
        """Run profile_run at the configured maxima (`max_num_batched_tokens`: the token
        budget in force), then say how many KV blocks this rank's budget holds (the
        engine takes the minimum over ranks)."""
        self.runner.profile_run(
            self.config.max_num_seqs, min(max_num_batched_tokens, self.config.max_num_seqs * self.max_model_len)
        )
        if self.config.calculate_kv_scales:
            self.runner.calibrate_kv_scales()
        return self.runner.num_blocks_for_budget()

    def initialize_cache(self, num_blocks: int) -> Any:
        """Allocate the KV cache with the block count the engine chose; returns the KV
        connector's handshake metadata (None without one)."""
        return self.runner.initialize_cache(num_blocks)

    def execute_model(self, steps: list[SchedulerOutput]) -> ModelRunnerOutput | None:
        """Run this rank's data-parallel replica's step of `steps` (one per replica);
        the driver rank returns its results."""
        return self.runner.execute_model(steps[self.parallel.dp_rank])

    def execute_subset(self, req_ids: list[str]) -> ModelRunnerOutput | None:
        """Run the last step again for only these requests (failure isolation)."""
        return self.runner.execute_subset(req_ids)

    def shutdown(self) -> None:
        """Leave the torch.distributed world."""
        if self.parallel.world_size > 1:
            destroy_parallel()
