"""One engine request as the server sees it once started: its outputs so far and to
come, recorded in metrics as they come and when it ends (finished, aborted or
failed), cut short when the shutdown drain window runs out, and aborted when its
client goes away."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Sequence

from ..core.engine.client import EngineClient
from ..core.errors import EngineDeadError, RequestFailedError
from ..core.outputs import RequestOutput
from .drain import DrainDeadline
from .errors import OpenAIError, logger
from .metrics import ServerMetrics


class RequestStream:
    """One started engine request: its first output and the ones still to come, each
    cumulative. Iterating yields them all; the finished one is recorded in metrics."""

    def __init__(
        self,
        engine: EngineClient,
        metrics: ServerMetrics,
        request_id: str,
        outputs: AsyncIterator[RequestOutput],
        first: RequestOutput,
        drain: DrainDeadline | None = None,
    ) -> None:
        self._engine = engine
        self._metrics = metrics
        self.request_id = request_id
        self._outputs = outputs
        self._drain = drain
        self.latest = first
        self._first_pending = True
        self._ended = False
        self._last_token_time = time.monotonic()
        self._num_tokens = 0

    def __aiter__(self) -> AsyncIterator[RequestOutput]:
        return self._iterate()

    async def _iterate(self) -> AsyncIterator[RequestOutput]:
        try:
            if self._first_pending:
                self._first_pending = False
                yield self._observed(self.latest)
            while not self.latest.finished:
                self.latest = await self._next()
                yield self._observed(self.latest)
        except OpenAIError as error:
            self._end("shutdown" if error.status_code == 503 else "failed")
            raise
        except Exception:
            self._end("failed")
            raise

    async def _next(self) -> RequestOutput:
        if self._drain is None:
            return await anext(self._outputs)
        output = asyncio.ensure_future(anext(self._outputs))
        expired = asyncio.ensure_future(self._drain.event.wait())
        try:
            await asyncio.wait((output, expired), return_when=asyncio.FIRST_COMPLETED)
        finally:
            expired.cancel()
        if output.done():
            return output.result()
        output.cancel()
        raise DrainDeadline.error()

    def _observed(self, output: RequestOutput) -> RequestOutput:
        num_tokens = sum(len(sample.token_ids) for sample in output.outputs)
        now = time.monotonic()
        if num_tokens > self._num_tokens:
            # vLLM's time per output token: each interval between outputs, per token.
            if self._num_tokens:
                self._metrics.output_interval((now - self._last_token_time) / (num_tokens - self._num_tokens))
            self._num_tokens, self._last_token_time = num_tokens, now
        if output.finished and not self._ended:
            self._ended = True
            self._metrics.request_finished(output, output.outputs[0].finish_reason or "abort")
        return output

    def _end(self, reason: str) -> None:
        if not self._ended:
            self._ended = True
            self._metrics.request_ended_early(reason)

    async def final(self) -> RequestOutput:
        """Run to the end and return the finished output."""
        try:
            async for _ in self:
                pass
        except OpenAIError:
            raise
        except Exception as error:
            raise engine_failure(error) from error
        return self.latest

    async def abort(self) -> None:
        """Stop the engine request (freeing its KV blocks) unless it already finished;
        counted as an abort."""
        if not self.latest.finished:
            self._end("abort")
            await self._engine.abort(self.request_id)


def engine_failure(error: BaseException) -> OpenAIError:
    """The 500 a client gets when the engine fails its request; the cause goes to the
    log only (its text can name internals): one line when the engine logged it already
    (a dead engine, a failed step: once for every request they take down), else with
    its traceback."""
    if isinstance(error, (EngineDeadError, RequestFailedError)):
        logger.error("the engine failed a request: %s", error)
    else:
        logger.error("the engine failed a request", exc_info=error)
    return OpenAIError(
        "the engine failed this request; the server log has the details", status_code=500, code="engine_error"
    )


async def abort_all(streams: Sequence[RequestStream]) -> None:
    """Abort every stream that has not finished."""
    for stream in streams:
        await stream.abort()
