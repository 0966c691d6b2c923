"""AsyncLLM: the engine behind the server, streaming each request's outputs.

One background task runs `LLMEngine.step` in a worker thread (torch releases the GIL,
so the event loop stays responsive) and routes every step's outputs to per-request
queues. A structured output request's grammar is compiled in another worker thread
before the request is added, so neither the event loop nor the steps of the requests
already running wait for it (the first grammar also builds llguidance's tokenizer,
about a second). Adding a request waits for the step in flight; aborting never waits:
it is applied before the next step, so a client that disconnects frees its blocks
within one step.

A request whose step failed because of it ends with RequestFailedError; the others go
on. If the engine dies (a worker process is gone), every request in flight ends with
EngineDeadError, `errored` turns True (the server's /health answers 503) and new
requests are refused.

    llm = AsyncLLM.from_engine_args("/models/tiny", backend="cpu")
    async for output in llm.generate("Hello", SamplingParams(max_tokens=8), "req-1"):
        print(output.outputs[0].text)          # cumulative text; output.finished at the end
    await llm.shutdown()
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
from collections.abc import AsyncIterator
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from ..device import BackendFactory
from .llm_engine import LLMEngine, PromptType
from ..errors import EngineDeadError, RequestFailedError
from ..lora.request import LoRARequest
from ..model_loader.model_config import ModelConfig
from ..outputs import RequestOutput
from ..sampling_params import SamplingParams
from ..stats import EngineStats
from ..model_loader.tokenizer import Tokenizer

logger = logging.getLogger("accord.engine")

#: Seconds between steps while only kept KV blocks wait for remote reads.
TRANSFER_POLL_S = 0.01

__all__ = ["AsyncLLM", "EngineDeadError", "RequestFailedError"]


class AsyncLLM:
    """An asyncio front to one LLMEngine: `generate` streams cumulative RequestOutputs
    per request (the last one has `finished=True`), `abort` stops a request and frees
    its blocks, `shutdown` stops the loop."""

    def __init__(self, engine: LLMEngine) -> None:
        self.engine = engine
        self._queues: dict[str, asyncio.Queue[RequestOutput | BaseException]] = {}
        self._pending_aborts: set[str] = set()
        self._lock = asyncio.Lock()
        self._wake = asyncio.Event()
        self._executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="accord-engine")
        self._grammar_pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="accord-grammar")
        self._loop_task: asyncio.Task[None] | None = None
        self._error: BaseException | None = None

    @classmethod
    def from_engine_args(cls, model: str, backend_factory: BackendFactory, **kwargs: Any) -> AsyncLLM:
        """Build the engine from keyword engine arguments (as `LLM(...)` takes them)."""
        return cls(LLMEngine.from_engine_args(model, backend_factory, **kwargs))

    @property
    def errored(self) -> bool:
        """Whether the engine is dead (requests fail with EngineDeadError)."""
        return self._error is not None or self.engine.dead_reason is not None

    @property
    def tokenizer(self) -> Tokenizer:
        """The model's tokenizer (encode, decode, apply_chat_template)."""
        return self.engine.tokenizer

    @property
    def model_config(self) -> ModelConfig:
        """The model's parsed config (vocab_size, eos_token_ids, ...)."""
        return self.engine.model_config

    @property
    def max_model_len(self) -> int:
        """The longest prompt plus output the engine accepts."""
        return self.engine.max_model_len

    @property
    def num_allocated_blocks(self) -> int:
        """KV blocks currently referenced by some request."""
        return self.engine.stats.kv_blocks_used

    def get_stats(self) -> EngineStats:
        """A snapshot of the engine's gauges and counters, for metrics."""
        return dataclasses.replace(self.engine.stats)

    def get_replica_stats(self) -> list[EngineStats]:
        """A snapshot of each data-parallel replica's gauges and counters, by replica."""
        return [dataclasses.replace(stats) for stats in self.engine.replica_stats]

    async def generate(
        self,
        prompt: PromptType,
        sampling_params: SamplingParams,
        request_id: str,
        priority: int = 0,
        lora_request: LoRARequest | None = None,
    ) -> AsyncIterator[RequestOutput]:
        """Add a request (under `lora_request`'s adapter, if given: add_lora it
        first, or its adapter is read here, on the loop) and yield its cumulative
        outputs until it finishes. Raises
        ValueError for an invalid request (before any output); closing or cancelling
        the iterator aborts the request."""
        if self.errored:
            raise EngineDeadError(self._dead_message()) from self._error
        if request_id in self._queues:
            raise ValueError(f"request id {request_id!r} is already in use")
        queue: asyncio.Queue[RequestOutput | BaseException] = asyncio.Queue()
        self._queues[request_id] = queue
        finished = False
        try:
            grammar = None
            if sampling_params.structured_outputs is not None:
                grammar = await asyncio.get_running_loop().run_in_executor(
                    self._grammar_pool, self.engine.compile_grammar, sampling_params
                )
            async with self._lock:
                self.engine.add_request(
                    request_id, prompt, sampling_params, priority=priority, grammar=grammar, lora_request=lora_request
                )
            self._start_loop()
            self._wake.set()
            while not finished:
                item = await queue.get()
                if isinstance(item, EngineDeadError):
                    raise item
                if isinstance(item, Exception):
                    raise RequestFailedError(f"the engine step running request {request_id!r} failed") from item
                if isinstance(item, BaseException):
                    raise EngineDeadError(self._dead_message()) from item
                finished = item.finished
                errors = [o.stop_reason for o in item.outputs if o.finish_reason == "error"]
                if finished and errors:
                    raise RequestFailedError(f"the engine step running request {request_id!r} failed: {errors[0]}")
                yield item
        finally:
            self._queues.pop(request_id, None)
            if not finished:
                self._abort_soon(request_id)

    def add_lora(self, lora_request: LoRARequest) -> bool:
        """Check a LoRA adapter so requests may name it (LLMEngine.add_lora; it reads
        the adapter, so call it off the event loop)."""
        return self.engine.add_lora(lora_request)

    def remove_lora(self, lora_int_id: int) -> bool:
        """Forget a LoRA adapter (LLMEngine.remove_lora)."""
        return self.engine.remove_lora(lora_int_id)

    async def reset_prefix_cache(self) -> int:
        """Empty the prefix cache of the blocks no running request holds, between two
        steps (LLMEngine.reset_prefix_cache); returns how many blocks left it."""
        async with self._lock:
            return self.engine.reset_prefix_cache()

    async def abort(self, request_id: str) -> None:
        """Stop a request; its blocks are freed before the next step, and its stream
        ends with a final output whose finish_reason is "abort"."""
        self._abort_soon(request_id)

    async def shutdown(self) -> None:
        """Stop the engine loop and its worker thread (the engine's workers stay up:
        `LLMEngine.shutdown` stops them)."""
        if self._loop_task is not None:
            self._loop_task.cancel()
            try:
                await self._loop_task
            except asyncio.CancelledError:
                pass
            self._loop_task = None
        self._executor.shutdown(wait=True)
        self._grammar_pool.shutdown(wait=True)

    def watch_engine(self) -> None:
        """Hear of the engine's death between steps too (a worker that dies while idle):
        call from the event loop that serves the requests."""
        loop = asyncio.get_running_loop()

        def wake() -> None:
            if not loop.is_closed():
                loop.call_soon_threadsafe(self._wake.set)

        self.engine.on_dead(wake)

    def _dead_message(self) -> str:
        reason = self.engine.dead_reason
        return f"the engine is dead: {reason}" if reason else "the engine loop has failed"

    def _abort_soon(self, request_id: str) -> None:
        self._pending_aborts.add(request_id)
        self._wake.set()

    def _fail_unfinished(self, error: Exception) -> None:
        """A step raised: abort every unfinished request (the step may have touched any
        of them) and hand each stream the error; later requests run normally."""
        logger.error("an engine step failed; failing its requests", exc_info=error)
        failed = self.engine.get_unfinished_request_ids()
        self.engine.abort_request(failed)
        for request_id in failed:
            queue = self._queues.get(request_id)
            if queue is not None:
                queue.put_nowait(error)

    def _start_loop(self) -> None:
        if self._loop_task is None or self._loop_task.done():
            self._loop_task = asyncio.get_running_loop().create_task(self._run())

    async def _run(self) -> None:
        loop = asyncio.get_running_loop()
        try:
            while True:
                await self._wake.wait()
                if self.engine.dead_reason is not None:
                    raise EngineDeadError(self._dead_message())
                polling = False
                async with self._lock:
                    outputs = []
                    if self._pending_aborts:
                        outputs = self.engine.abort_request(list(self._pending_aborts))
                        self._pending_aborts.clear()
                    if self.engine.has_unfinished_requests():
                        try:
                            outputs += await loop.run_in_executor(self._executor, self.engine.step)
                        except EngineDeadError:
                            raise
                        except Exception as error:  # noqa: BLE001 - fail the step's requests, not the server
                            self._fail_unfinished(error)
                    elif self.engine.awaits_transfers():
                        await loop.run_in_executor(self._executor, self.engine.step)
                        polling = True
                    else:
                        self._wake.clear()
                for output in outputs:
                    queue = self._queues.get(output.request_id)
                    if queue is not None:
                        queue.put_nowait(output)
                if polling:
                    # Only remote instances' reads are awaited: poll for them without spinning.
                    await asyncio.sleep(TRANSFER_POLL_S)
        except asyncio.CancelledError:
            raise
        except BaseException as error:  # noqa: BLE001 - every waiter must hear of it
            # The one traceback of the engine's death: each request it fails says only that.
            logger.error("the engine loop stopped; every request fails from now on", exc_info=error)
            self._error = error
            if not isinstance(error, EngineDeadError):
                error = EngineDeadError(self._dead_message())
                error.__cause__ = self._error
            for queue in self._queues.values():
                queue.put_nowait(error)
