"""One engine request as the server sees it once started: its outputs so far and to
come, recorded in metrics when it finishes, and aborted when its client goes away."""

from __future__ import annotations

from collections.abc import AsyncIterator, Sequence

from ..core.async_engine import AsyncLLM
from ..core.outputs import RequestOutput
from .errors import OpenAIError, logger
from .metrics import ServerMetrics


class RequestStream:
    """One started engine request: its first output and the ones still to come, each
    cumulative. Iterating yields them all; the finished one is recorded in metrics."""

    def __init__(
        self, engine: AsyncLLM, metrics: ServerMetrics, request_id: str, outputs: AsyncIterator[RequestOutput],
        first: RequestOutput,
    ) -> None:
        self._engine = engine
        self._metrics = metrics
        self.request_id = request_id
        self._outputs = outputs
        self.latest = first
        self._first_pending = True

    def __aiter__(self) -> AsyncIterator[RequestOutput]:
        return self._iterate()

    async def _iterate(self) -> AsyncIterator[RequestOutput]:
        if self._first_pending:
            self._first_pending = False
            yield self._observed(self.latest)
        while not self.latest.finished:
            self.latest = await anext(self._outputs)
            yield self._observed(self.latest)

    def _observed(self, output: RequestOutput) -> RequestOutput:
        if output.finished:
            self._metrics.request_finished(output.metrics, output.outputs[0].finish_reason or "abort")
        return output

    async def final(self) -> RequestOutput:
        """Run to the end and return the finished output."""
        try:
            async for _ in self:
                pass
        except Exception as error:
            raise engine_failure(error) from error
        return self.latest

    async def abort(self) -> None:
        """Stop the engine request (freeing its KV blocks) unless it already finished."""
        if not self.latest.finished:
            await self._engine.abort(self.request_id)


def engine_failure(error: BaseException) -> OpenAIError:
    """The 500 a client gets when the engine fails its request (logged with its cause)."""
    logger.error("the engine failed a request", exc_info=error)
    return OpenAIError(f"the engine failed this request: {type(error).__name__}: {error}", status_code=500)


async def abort_all(streams: Sequence[RequestStream]) -> None:
    """Abort every stream that has not finished."""
    for stream in streams:
        await stream.abort()
