"""LLMEngine: requests in, one scheduled step at a time, RequestOutputs out.

It wires the parts together (backend, model, tokenizer, runner, block manager,
scheduler) and owns what happens after a step: appending tokens, detokenising,
stop conditions, freeing finished sequences and building outputs.
"""

from __future__ import annotations

import dataclasses
import itertools
import logging
import time
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, fields
from typing import Any

from ..backends import get_backend
from ..op_contracts import OpDispatcher
from .block_manager import BlockManager
from .config import EngineConfig
from .detokenizer import IncrementalDetokenizer
from .model_runner import ModelRunner
from .models import load_model
from .outputs import CompletionOutput, Logprob, RequestOutput
from .sampler import SampledToken
from .sampling_params import SamplingParams
from .scheduler import Scheduler, SchedulerOutput
from .sequence import Sequence
from .stats import EngineStats, RequestTimes
from .structured_output import StructuredOutputManager
from .tokenizer import load_tokenizer

logger = logging.getLogger("accord.engine")

#: What a prompt may be: text, or a dict with `prompt_token_ids` (or `prompt`).
PromptType = str | Mapping[str, Any]


@dataclass
class Request:
    """A user request: its prompt and the n sequences sampling it."""

    request_id: str
    prompt: str | None
    prompt_token_ids: list[int]
    seqs: list[Sequence]
    times: RequestTimes

    @property
    def finished(self) -> bool:
        return all(seq.is_finished for seq in self.seqs)


class LLMEngine:
    """The synchronous engine: `add_request`, then `step` until
    `has_unfinished_requests()` is False."""

    def __init__(self, config: EngineConfig) -> None:
        self.config = config
        backend = get_backend(config.backend)
        supported = backend.supported_block_sizes()
        if supported is not None and config.block_size not in supported:
            raise ValueError(f"block_size={config.block_size} is not one backend {backend.name!r} takes: {supported}")
        self.backend = backend
        self.ops = OpDispatcher(backend)
        loaded = load_model(
            config.model,
            self.ops,
            dtype=config.dtype,
            quantization=config.quantization,
            compute_dtype=backend.compute_dtype,
        )
        self.model_config = loaded.config
        self.tokenizer = load_tokenizer(config.tokenizer or config.model)
        self.max_model_len = self._max_model_len()
        self.runner = ModelRunner(config, backend, self.ops, loaded.model, loaded.config.dtype, self.max_model_len)
        self.runner.profile_run(
            config.max_num_seqs, min(config.max_num_batched_tokens, config.max_num_seqs * self.max_model_len)
        )
        num_blocks = self.runner.num_blocks_for_budget()
        if num_blocks * config.block_size < self.max_model_len:
            raise ValueError(
                f"the KV cache budget holds {num_blocks * config.block_size} tokens, fewer than "
                f"max_model_len={self.max_model_len}; raise kv_cache_memory (or gpu_memory_utilization) "
                "or lower max_model_len"
            )
        self.runner.allocate_kv_cache(num_blocks)
        self.block_manager = BlockManager(
            num_blocks, config.block_size, config.enable_prefix_caching, config.prefix_caching_hash_algo
        )
        self.scheduler = Scheduler(
            self.block_manager,
            config.max_num_batched_tokens,
            config.max_num_seqs,
            config.scheduling_policy,  # type: ignore[arg-type]
        )
        self.requests: dict[str, Request] = {}
        self.structured_output = StructuredOutputManager(
            self.tokenizer, self.model_config.vocab_size, self.model_config.eos_token_ids
        )
        self.stats = EngineStats(kv_blocks_total=num_blocks)
        self._seq_counter = itertools.count()
        logger.info(
            "engine ready on backend %s: %d KV blocks of %d tokens (%s, %.1f MiB)",
            backend.name,
            num_blocks,
            config.block_size,
            self.runner.kv_cache_dtype,
            num_blocks * self.runner.bytes_per_block / 2**20,
        )

    @classmethod
    def from_engine_args(cls, model: str, **kwargs: Any) -> LLMEngine:
        """Build from keyword engine arguments (vLLM's names); unknown names raise TypeError."""
        known = {f.name for f in fields(EngineConfig)}
        unknown = sorted(set(kwargs) - known)
        if unknown:
            raise TypeError(f"unknown engine arguments: {', '.join(unknown)}; known: {', '.join(sorted(known))}")
        return cls(EngineConfig(model=model, **kwargs))

    def _max_model_len(self) -> int:
        limit = self.model_config.max_position_embeddings
        wanted = self.config.max_model_len or limit
        if wanted > limit:
            raise ValueError(f"max_model_len={wanted} exceeds the model's max_position_embeddings={limit}")
        return wanted

    # -- requests ------------------------------------------------------------------
    def add_request(
        self,
        request_id: str,
        prompt: PromptType,
        params: SamplingParams | None = None,
        arrival_time: float | None = None,
        priority: int = 0,
    ) -> None:
        """Queue a request; raises ValueError for an unusable prompt or settings."""
        if request_id in self.requests:
            raise ValueError(f"request id {request_id!r} is already in use")
        params = params or SamplingParams()
        text, token_ids = self._tokenize(prompt)
        self._check_request(token_ids, params)
        grammar = None if params.structured_outputs is None else self.structured_output.compile(params.structured_outputs)
        times = RequestTimes(arrival_time=time.monotonic() if arrival_time is None else arrival_time)
        order = next(self._seq_counter)
        seqs: list[Sequence] = []
        for index in range(params.n):
            seq = Sequence(
                seq_id=f"{order}.{index}",
                request_id=request_id,
                index=index,
                prompt_token_ids=token_ids,
                params=params.for_child(index, set(self.model_config.eos_token_ids)),
                priority=priority,
                arrival_order=order,
                times=times,
                prompt_source=seqs[0] if seqs else None,
            )
            if params.detokenize:
                seq.detokenizer = IncrementalDetokenizer(
                    self.tokenizer,
                    seq.token_ids,
                    len(token_ids),
                    params.stop,  # type: ignore[arg-type]
                    params.include_stop_str_in_output,
                    params.skip_special_tokens,
                )
            seqs.append(seq)
            self.scheduler.add(seq)
            if grammar is not None:
                self.structured_output.add(seq.seq_id, grammar)
        self.requests[request_id] = Request(request_id, text, token_ids, seqs, times)

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
        now, outputs = time.monotonic(), []
        for request_id in [request_ids] if isinstance(request_ids, str) else request_ids:
            request = self.requests.pop(request_id, None)
            if request is None:
                continue
            for seq in request.seqs:
                if not seq.is_finished:
                    seq.finish("abort")
                    self.scheduler.finish(seq)
                    self.structured_output.remove(seq.seq_id)
            request.times.finished_time = now
            outputs.append(make_request_output(request, finished=True))
        self._update_gauges()
        return outputs

    def has_unfinished_requests(self) -> bool:
        """Whether any request is waiting or running."""
        return bool(self.requests)

    def get_num_unfinished_requests(self) -> int:
        """How many requests are waiting or running."""
        return len(self.requests)

    # -- a step --------------------------------------------------------------------
    def step(self) -> list[RequestOutput]:
        """Schedule and run one step; return the outputs of requests that progressed."""
        step = self.scheduler.schedule()
        if step.is_empty:
            self._update_gauges()
            return []
        tables = [self.block_manager.block_table(seq.seq_id) for seq in step.sequences]
        samplers = [
            seq.seq_id for seq in step.sequences
            if seq.num_computed_tokens + step.num_scheduled_tokens[seq.seq_id] == seq.num_tokens
        ]
        step = dataclasses.replace(step, grammar_bitmask=self.structured_output.grammar_bitmask(samplers))
        result = self.runner.execute(step, tables)
        now = time.monotonic()
        self._advance(step, now)
        for seq, entries in result.prompt_logprobs:
            if seq.params.detokenize:
                for entry in entries:
                    self._decode_logprob_tokens(entry)
            seq.prompt_logprobs.extend(entries)  # type: ignore[union-attr]
        for seq, sampled in result.sampled:
            self._append(seq, sampled, now)
        self.stats.num_preemptions += len(step.preempted)
        self.stats.num_steps += 1
        self.stats.observe_iteration(step.total_num_scheduled_tokens)
        self._update_gauges()
        return self._outputs({seq.request_id for seq in step.sequences}, now)

    def _advance(self, step: SchedulerOutput, now: float) -> None:
        """Count this step's computed tokens."""
        for seq in step.sequences:
            count = step.num_scheduled_tokens[seq.seq_id]
            self.stats.computed_prompt_tokens += max(
                0, min(seq.num_computed_tokens + count, seq.num_prompt_tokens) - seq.num_computed_tokens
            )
            seq.num_computed_tokens += count
            if seq.times.first_scheduled_time is None:
                seq.times.first_scheduled_time = now

    def _append(self, seq: Sequence, sampled: SampledToken, now: float) -> None:
        """Add a sampled token to its sequence and finish the sequence if it must stop."""
        if seq.times.first_token_time is None:
            seq.times.first_token_time = now
        if seq.num_output_tokens == 0 and seq.index == 0:
            self.stats.prompt_tokens += seq.num_prompt_tokens
        seq.times.num_generation_tokens += 1
        self.stats.generation_tokens += 1
        if sampled.top is not None and seq.params.detokenize:
            self._decode_logprob_tokens(sampled.top)
        seq.append_token(sampled.token_id, sampled.logprob, sampled.top)
        params, token = seq.params, sampled.token_id
        may_stop = seq.num_output_tokens >= params.min_tokens
        stop_string = seq.detokenizer.update(find_stop=may_stop) if seq.detokenizer else None
        grammar_complete = self.structured_output.accept(seq.seq_id, token)
        if may_stop and token in params.all_stop_token_ids:
            seq.finish("stop", None if token in self.model_config.eos_token_ids else token)
        elif stop_string is not None:
            seq.finish("stop", stop_string)
        elif grammar_complete:
            seq.finish("stop")
        elif (
            params.max_tokens is not None and seq.num_output_tokens >= params.max_tokens
        ) or seq.num_tokens >= self.max_model_len:
            seq.finish("length")
        if seq.is_finished:
            self.scheduler.finish(seq)
            self.structured_output.remove(seq.seq_id)

    def _decode_logprob_tokens(self, entry: dict[int, Logprob]) -> None:
        for token_id, logprob in entry.items():
            logprob.decoded_token = self.tokenizer.decode([token_id])

    def _outputs(self, request_ids: set[str], now: float) -> list[RequestOutput]:
        outputs = []
        for request_id in request_ids:
            request = self.requests[request_id]
            finished = request.finished
            if finished:
                request.times.finished_time = now
                del self.requests[request_id]
            outputs.append(make_request_output(request, finished))
        return outputs

    def _update_gauges(self) -> None:
        stats = self.stats
        stats.num_running = len(self.scheduler.running)
        stats.num_waiting = len(self.scheduler.waiting)
        stats.kv_blocks_used = self.block_manager.num_used_blocks
        stats.prefix_cache_queries = self.block_manager.counters.queries
        stats.prefix_cache_hits = self.block_manager.counters.hits


def make_request_output(request: Request, finished: bool) -> RequestOutput:
    """A cumulative snapshot of a request's samples."""
    completions = [
        CompletionOutput(
            index=seq.index,
            text=seq.output_text,
            token_ids=list(seq.output_token_ids),
            cumulative_logprob=seq.cumulative_logprob,
            logprobs=list(seq.logprobs) if seq.logprobs is not None else None,
            finish_reason=seq.finish_reason,
            stop_reason=seq.stop_reason,
        )
        for seq in request.seqs
    ]
    first = request.seqs[0]
    return RequestOutput(
        request_id=request.request_id,
        prompt=request.prompt,
        prompt_token_ids=request.prompt_token_ids,
        prompt_logprobs=list(first.prompt_logprobs) if first.prompt_logprobs is not None else None,
        outputs=completions,
        finished=finished,
        num_cached_tokens=first.num_cached_tokens,
        metrics=request.times,
    )
