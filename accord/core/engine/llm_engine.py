"""LLMEngine: requests in, one scheduled step at a time, RequestOutputs out.

A step is: the scheduler builds a plain SchedulerOutput, the executor runs it on every
worker, the scheduler applies the results (tokens, stops, freed blocks), the output
processor detokenises and builds the outputs. The engine is handed its backend (a
factory, so worker processes can build their own); it never picks one itself.

With data parallelism (`data_parallel_size` > 1) the engine holds one scheduler (and
KV block manager) per replica: a new request goes to the replica the balancer picks
(least outstanding tokens, prefix affinity); every step all replicas schedule, and
their steps go out together, so whether anyone has work is decided here, once, for all.
When nobody has work nobody steps; when some replica has work and the model's MoE layers
exchange tokens across replicas (expert parallelism), an idle replica runs a dummy
batch so its peers' collectives are never left waiting.

With --async-scheduling (vLLM v1's) the engine keeps up to two steps in flight: it
schedules step N+1 (sequences hold placeholders for the tokens step N samples) and
hands it to the executor, then waits for step N's results and processes them, so the
scheduling, the output processing and detokenisation hide behind step N+1's compute.
Without it the same loop keeps one step in flight: each step's results are applied
before the next is scheduled.

A step that raises because of some of its requests fails only those: the engine runs
the step again in halves until the failing requests are found, finishes them with
finish_reason "error" and carries on with the rest (failure_isolation.py; with several replicas, whose other
replicas already advanced, the whole step's requests fail instead). A dead executor (a
worker process gone) raises EngineDeadError.
"""

from __future__ import annotations

import itertools
import logging
import time
from collections import deque
from collections.abc import Callable, Iterable, Mapping
from concurrent.futures import Future, wait
from dataclasses import dataclass, fields, replace
from typing import Any

from ..sched.block_manager import BlockManager
from ..config import EngineConfig
from ..device import BackendFactory
from ..sched.dp_balancer import DataParallelBalancer
from ..errors import EngineDeadError
from ..lora.registry import LoRARegistry
from ..lora.request import LoRARequest
from ..executor import Executor, executor_class
from ..executor.base import StepSkipped
from ..model_loader.model_config import ModelConfig
from ..model_loader.load import read_model_config
from ..cache_affinity import CacheAffinity
from .failure_isolation import isolate_failure
from ..kv_transfer.factory import make_scheduler_connector
from .output_processor import OutputProcessor
from .stats_log import PeriodicStatsLog
from ..outputs import RequestOutput
from ..sampling_params import SamplingParams
from ..sched.output import ModelRunnerOutput, RequestUpdate, SchedulerOutput
from ..sched.policy import make_policy
from ..sched.scheduler import Scheduler
from ..sched.request import Request
from ..stats import EngineStats
from ..structured_output import GrammarCompiler, StructuredOutputManager
from .token_budget import choose_token_budget
from ..model_loader.source import load_tokenizer
from ..model_loader.tokenizer import Tokenizer
from ..worker.worker import WorkerInfo

logger = logging.getLogger("accord.engine")

#: What a prompt may be: text, or a dict with `prompt_token_ids` (or `prompt`), and
#: optionally `cache_salt`, `session_id` and `tenant` (cache_affinity.py).
PromptType = str | Mapping[str, Any]


@dataclass
class _StepInFlight:
    """A step handed to the executor: every replica's SchedulerOutput and the future
    of their results."""

    steps: list[SchedulerOutput]
    results: Future[list[ModelRunnerOutput | None]]
    #: perf_counter when it was handed over with no step ahead of it (so its results'
    #: wait is its own run time: adaptive speculation's step times); None otherwise.
    started_alone: float | None = None


class LLMEngine:
    """The synchronous engine: `add_request`, then `step` until
    `has_unfinished_requests()` is False; `shutdown` stops its workers."""

    def __init__(self, config: EngineConfig, backend_factory: BackendFactory) -> None:
        self.config = config
        _verify_parallel_layout(config, backend_factory)
        self.executor: Executor = executor_class(config.executor_backend)(config, backend_factory)
        try:
            info: WorkerInfo = self.executor.collective_rpc("info")[0]
            if config.max_num_batched_tokens is None:
                config = self.config = replace(config, max_num_batched_tokens=self._measured_token_budget())
            # profile_run on every rank at the maxima; the KV budget is per rank.
            num_blocks = min(self.executor.collective_rpc("determine_num_blocks", (config.max_num_batched_tokens,)))
            max_model_len = info.max_model_len
            if num_blocks * config.block_size < max_model_len:
                raise ValueError(
                    f"the KV cache budget holds {num_blocks * config.block_size} tokens, fewer than "
                    f"max_model_len={max_model_len}; raise kv_cache_memory (or gpu_memory_utilization) "
                    "or lower max_model_len"
                )
            connector_metadata = self.executor.collective_rpc("initialize_cache", (num_blocks,))
            self.tokenizer: Tokenizer = load_tokenizer(config.tokenizer or config.model)
        except BaseException:
            self.executor.shutdown()
            raise
        self.backend_name = info.backend_name
        self.model_config: ModelConfig = info.model_config
        self.max_model_len = max_model_len
        #: Compiles structured output constraints (the schedulers' matchers share its
        #: llguidance tokenizer).
        self.grammar_compiler = GrammarCompiler(self.tokenizer, info.model_config.vocab_size)
        #: One scheduler (with its own KV block manager) per data-parallel replica.
        self.schedulers = [
            Scheduler(
                BlockManager(
                    num_blocks, config.block_size, config.enable_prefix_caching, config.prefix_caching_hash_algo
                ),
                config.max_num_batched_tokens,
                config.max_num_seqs,
                make_policy(config.scheduling_policy, config.max_num_seqs, max_model_len, config.effort_lane_bounds),
                max_model_len=max_model_len,
                eos_token_ids=info.model_config.eos_token_ids,
                structured_output=StructuredOutputManager(self.grammar_compiler, info.model_config.eos_token_ids),
                speculative=config.speculative,
                max_loras=config.max_loras if config.enable_lora else 0,
                max_thinking_tokens_per_tenant=config.max_thinking_tokens_per_tenant,
                kv_connector=(
                    None if config.kv_transfer is None
                    else make_scheduler_connector(config.kv_transfer, config.block_size, info.bytes_per_block)
                ),
            )
            for _ in range(config.data_parallel_size)
        ]
        for replica, scheduler in enumerate(self.schedulers):
            if scheduler.kv_connector is not None:
                ranks = config.tensor_parallel_size
                scheduler.kv_connector.set_worker_metadata(connector_metadata[replica * ranks : (replica + 1) * ranks])
        #: The LoRA adapters checked for this model (None: LoRA off).
        self.loras = LoRARegistry(info.model_config, config.max_lora_rank) if config.enable_lora else None
        self.balancer = DataParallelBalancer(config.block_size, affinity_slack=config.max_num_batched_tokens)
        # Idle replicas must join the MoE layers' token exchange over the whole world.
        self._pads_idle_replicas = (
            config.data_parallel_size > 1 and config.enable_expert_parallel and info.model_config.moe is not None
        )
        #: Dummy batches each replica has run (it was idle while another computed).
        self.num_dummy_steps = [0] * config.data_parallel_size
        self.output_processor = OutputProcessor(self.tokenizer)
        self._seq_counter = itertools.count()
        #: Steps handed to the executor whose results are not applied yet, oldest first.
        self._in_flight: deque[_StepInFlight] = deque()
        self._max_in_flight = 2 if config.async_scheduling else 1
        self._stats_log = PeriodicStatsLog()
        logger.info(
            "engine ready on backend %s, %d x %d rank(s) (TP x DP, %s executor): %d KV blocks of %d tokens per rank "
            "(%s, %.1f MiB)",
            info.backend_name,
            config.tensor_parallel_size,
            config.data_parallel_size,
            config.executor_backend,
            num_blocks,
            config.block_size,
            info.kv_cache_dtype,
            num_blocks * info.bytes_per_block / 2**20,
        )

    def _measured_token_budget(self) -> int:
        """The default step token budget, from step times measured on every rank (the
        slowest rank's time counts; all ranks run the same steps, so collectives meet)."""
        budget = choose_token_budget(
            lambda tokens: max(self.executor.collective_rpc("time_step", (tokens,))),
            floor=self.config.max_num_seqs,
        )
        logger.info("default token budget from measured step times: %s", budget.describe())
        return budget.tokens

    @classmethod
    def from_engine_args(cls, model: str, backend_factory: BackendFactory, **kwargs: Any) -> LLMEngine:
        """Build from keyword engine arguments (vLLM's names); unknown names raise TypeError."""
        return cls(engine_config(model, **kwargs), backend_factory)

    @property
    def scheduler(self) -> Scheduler:
        """The first replica's scheduler (the only one without data parallelism)."""
        return self.schedulers[0]

    @property
    def stats(self) -> EngineStats:
        """The schedulers' gauges (as of the last change) and counters, over all replicas."""
        if len(self.schedulers) == 1:
            return self.schedulers[0].stats
        return EngineStats.combined(self.replica_stats)

    @property
    def replica_stats(self) -> list[EngineStats]:
        """Each data-parallel replica's gauges and counters, by replica."""
        return [scheduler.stats for scheduler in self.schedulers]

    @property
    def dead_reason(self) -> str | None:
        """Why the engine can no longer step (a worker process gone), or None."""
        return self.executor.dead_reason

    def on_dead(self, callback: Callable[[], None]) -> None:
        """Call `callback` (from any thread) when the engine dies, even between steps."""
        self.executor.on_dead = callback

    def shutdown(self) -> None:
        """Stop the workers (idempotent)."""
        self.executor.shutdown()

    # -- requests ------------------------------------------------------------------
    def add_request(
        self,
        request_id: str,
        prompt: PromptType,
        params: SamplingParams | None = None,
        arrival_time: float | None = None,
        priority: int = 0,
        *,
        grammar: str | None = None,
        lora_request: LoRARequest | None = None,
    ) -> None:
        """Queue a request, under `lora_request`'s adapter if given; raises ValueError
        for an unusable prompt, settings or adapter (LoRAAdapterError, naming the problem).
        `grammar`, from `compile_grammar`, saves compiling the request's constraint here."""
        if request_id in self.output_processor:
            raise ValueError(f"request id {request_id!r} is already in use")
        if lora_request is not None:
            self.add_lora(lora_request)
        params = params or SamplingParams()
        text, token_ids = self._tokenize(prompt)
        affinity = CacheAffinity.of(prompt)
        self._check_request(token_ids, params)
        scheduler = self.schedulers[
            self.balancer.choose(token_ids, [s.outstanding_tokens for s in self.schedulers])
            if len(self.schedulers) > 1
            else 0
        ]
        if grammar is None:
            grammar = self.compile_grammar(params)  # ValueError when it does not compile
        arrival = time.monotonic() if arrival_time is None else arrival_time
        order = next(self._seq_counter)
        eos_token_ids = set(self.model_config.eos_token_ids)
        samples = [(f"{order}.{index}", params.for_child(index, eos_token_ids)) for index in range(params.n)]
        self.output_processor.add_request(request_id, text, token_ids, samples, arrival)
        first: Request | None = None
        for index, (req_id, sample_params) in enumerate(samples):
            request = Request(
                req_id, token_ids, sample_params, index=index, priority=priority, arrival_time=arrival,
                arrival_order=order, prompt_source=first, lora_request=lora_request,
                cache_salt=affinity.cache_salt, session_id=affinity.session_id, tenant=affinity.tenant,
            )
            first = first or request
            scheduler.add_request(request, grammar)

    def add_lora(self, lora_request: LoRARequest) -> bool:
        """Check an adapter so requests may name it (vLLM's add_lora); whether it was
        new. ValueError when LoRA is off, LoRAAdapterError for an unusable adapter."""
        if self.loras is None:
            raise ValueError(f"LoRA adapter {lora_request.lora_name!r} asked for, but LoRA is off (enable_lora)")
        return self.loras.add(lora_request)

    def remove_lora(self, lora_int_id: int) -> bool:
        """Forget an adapter (vLLM's remove_lora); whether it was known. Requests
        already running on it finish on it; the workers then free its device slot and
        host copy."""
        if self.loras is None or not self.loras.remove(lora_int_id):
            return False
        for scheduler in self.schedulers:
            scheduler.unload_lora(lora_int_id)
        return True

    def list_loras(self) -> set[int]:
        """The ids of the adapters added and not removed (vLLM's list_loras)."""
        return set() if self.loras is None else self.loras.ids()

    def reset_prefix_cache(self) -> int:
        """Empty every data-parallel replica's prefix cache of the blocks no running
        request holds (BlockManager.reset_prefix_cache: blocks in use stay cached);
        returns how many blocks left the caches. The block managers live here, in the
        engine, for all replicas; the workers hold KV only, so nothing crosses the
        executor. A KV connector's external tier (--kv-offloading-size) is not reset."""
        dropped = sum(scheduler.block_manager.reset_prefix_cache() for scheduler in self.schedulers)
        logger.info("prefix cache reset: %d cached block(s) no request holds were dropped", dropped)
        return dropped

    def compile_grammar(self, params: SamplingParams) -> str | None:
        """The checked grammar `params` constrain generation to (None without a
        constraint); ValueError when it does not compile. Safe from any thread, so a
        caller on an event loop runs it in a worker thread: it takes up to seconds (the
        first one also builds llguidance's tokenizer)."""
        if params.structured_outputs is None:
            return None
        return self.grammar_compiler.compile(params.structured_outputs)

    def _tokenize(self, prompt: PromptType) -> tuple[str | None, list[int]]:
        if isinstance(prompt, str):
            return prompt, list(self.tokenizer.encode(prompt))
        if "prompt_token_ids" in prompt:
            return prompt.get("prompt"), [int(t) for t in prompt["prompt_token_ids"]]
        if "prompt" in prompt:
            return prompt["prompt"], list(self.tokenizer.encode(prompt["prompt"]))
        raise ValueError("a prompt is a string or a dict with 'prompt_token_ids' or 'prompt'")

    def _check_request(self, token_ids: list[int], params: SamplingParams) -> None:
        vocab = self.model_config.vocab_size
        if not token_ids:
            raise ValueError("the prompt is empty")
        if len(token_ids) >= self.max_model_len:
            raise ValueError(
                f"the prompt has {len(token_ids)} tokens, which leaves no room to generate within "
                f"max_model_len={self.max_model_len}"
            )
        if min(token_ids) < 0 or max(token_ids) >= vocab:
            raise ValueError(f"prompt token ids must be in [0, {vocab})")
        params.verify_vocab(vocab)

    def abort_request(self, request_ids: str | Iterable[str]) -> list[RequestOutput]:
        """Stop requests now and free all their blocks; return each one's final output
        (finish_reason "abort"). Unknown or already finished ids are ignored."""
        ids = [request_ids] if isinstance(request_ids, str) else list(request_ids)
        self._finish_in_schedulers(self.output_processor.sample_ids(ids), "abort")
        return self.output_processor.abort(ids, time.monotonic())

    def has_unfinished_requests(self) -> bool:
        """Whether any request is waiting or running."""
        return self.output_processor.num_unfinished > 0

    def awaits_transfers(self) -> bool:
        """Whether finished requests' blocks wait for a remote instance to read them, or
        a KV connector has a notification to send: stepping (with nothing to compute)
        lets the workers report the reads and send the notifications."""
        return any(scheduler.awaits_transfers for scheduler in self.schedulers)

    def get_num_unfinished_requests(self) -> int:
        """How many requests are waiting or running."""
        return self.output_processor.num_unfinished

    def get_unfinished_request_ids(self) -> list[str]:
        """The ids of the requests waiting or running, oldest first."""
        return self.output_processor.request_ids

    def _finish_in_schedulers(self, req_ids: list[str], reason: str) -> None:
        """Finish these samples in whichever replica's scheduler holds them."""
        if req_ids:
            for scheduler in self.schedulers:
                scheduler.finish_requests(req_ids, reason)

    # -- a step --------------------------------------------------------------------
    def step(self, *, final_only: bool = False) -> list[RequestOutput]:
        """Schedule a step on every replica and hand it to the executor, then apply the
        oldest step in flight's results; return the outputs of requests that
        progressed (or failed), or with `final_only` only of those that finished
        (vLLM's FINAL_ONLY output kind: no output is built for a request still
        running). Under async scheduling the first call after an idle spell only
        launches a step (and returns nothing), so the next call schedules the step
        after it while it runs."""
        if len(self._in_flight) < self._max_in_flight and not (
            self._in_flight and any(scheduler.needs_landed_tokens() for scheduler in self.schedulers)
        ):
            self._launch()
        if not self._in_flight:
            return []
        if len(self._in_flight) < self._max_in_flight and not self._in_flight[0].results.done():
            return []
        return self._apply(self._in_flight.popleft(), final_only)

    def _launch(self) -> None:
        """Schedule every replica and hand the step to the executor (to run after the
        step in flight, if any)."""
        steps = [scheduler.schedule() for scheduler in self.schedulers]
        if all(step.is_empty for step in steps):
            if not any(
                step.finished_req_ids or step.preempted_req_ids or step.kv_connector_metadata
                or scheduler.awaits_transfers
                for step, scheduler in zip(steps, self.schedulers)
            ):
                return
            # Nothing to compute; the runners only drop these requests or send notifications.
        else:
            for replica, step in enumerate(steps):
                if step.is_empty and self._pads_idle_replicas:
                    step.dummy_batch = True
                    self.num_dummy_steps[replica] += 1
        after = self._in_flight[-1].results if self._in_flight else None
        started = None if after is not None else time.perf_counter()
        self._in_flight.append(_StepInFlight(steps, self.executor.execute_model_async(steps, after), started))

    def _apply(self, flight: _StepInFlight, final_only: bool) -> list[RequestOutput]:
        """Apply a finished step's results to the schedulers and build the outputs
        (only of finished requests with `final_only`)."""
        results, updates = self._results(flight)
        seconds = None
        if flight.started_alone is not None and flight.results.exception() is None:
            seconds = time.perf_counter() - flight.started_alone
        for scheduler, step, result in zip(self.schedulers, flight.steps, results):
            if not step.is_empty and result is not None:
                updates += scheduler.update_from_output(step, result, seconds)
            scheduler.free_transferred(set() if result is None else result.kv_finished_sending)
            if result is not None:
                scheduler.finish_loads(result.kv_finished_recving, result.kv_failed_recving)
        now = time.monotonic()
        processed = self.output_processor.process(updates, now, final_only)
        self._stats_log.maybe_log(self.stats, now)
        # Samples whose text completed a stop string: the scheduler frees them.
        self._finish_in_schedulers(processed.req_ids_to_abort, "stop")
        return processed.outputs

    def _results(self, flight: _StepInFlight) -> tuple[list[ModelRunnerOutput | None], list[RequestUpdate]]:
        """A step's results; if it raised, fail the requests that make it fail and keep
        the others' results: with one replica the step is re-run in halves until they
        are found; with several (some replicas already advanced their requests) every
        request of the step fails. The steps queued behind it were skipped (they read
        its tokens): they are handed to the executor again once it is dealt with."""
        try:
            return flight.results.result(), []
        except EngineDeadError:
            raise
        except Exception as error:  # noqa: BLE001 - isolated below, the engine carries on
            # The worker must be idle while the failure is isolated: wait out the skipped steps.
            wait([queued.results for queued in self._in_flight])
            try:
                return isolate_failure(self.executor, self.schedulers, flight.steps, error)
            finally:
                self._rerun_skipped()

    def _rerun_skipped(self) -> None:
        """Hand the steps skipped after a failed one to the executor again, in order."""
        after = None
        for queued in self._in_flight:
            if isinstance(queued.results.exception(), StepSkipped):
                queued.results = self.executor.execute_model_async(queued.steps, after)
                queued.started_alone = None  # its wait includes the failed step's isolation
            after = queued.results


def _verify_parallel_layout(config: EngineConfig, backend_factory: BackendFactory) -> None:
    """Refuse, before any worker starts, a parallel layout the model's experts or the
    host's devices do not fit (EngineConfig.verify_with_model has the rules)."""
    if config.world_size == 1:
        return
    num_experts = None
    if config.enable_expert_parallel:
        try:
            moe = read_model_config(config.model).moe
        except (OSError, ValueError):
            moe = None  # not a readable model: the workers report why, with the rank
        num_experts = moe.num_experts if moe is not None else None
    config.verify_with_model(num_experts, backend_factory().device_count())


def engine_config(model: str, **kwargs: Any) -> EngineConfig:
    """An EngineConfig from keyword engine arguments (vLLM's names); unknown names
    raise TypeError."""
    known = {f.name for f in fields(EngineConfig)}
    unknown = sorted(set(kwargs) - known)
    if unknown:
        raise TypeError(f"unknown engine arguments: {', '.join(unknown)}; known: {', '.join(sorted(known))}")
    return EngineConfig(model=model, **kwargs)
