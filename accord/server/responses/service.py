"""`/v1/responses`: create (whole, streamed as server-sent events, or in the
background), retrieve, cancel and delete responses. Each one is answered by the chat
machinery (ChatService) over the request translated to chat messages; the builder turns
its chunks into the Responses API's items and events."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from contextlib import aclosing

from fastapi.responses import StreamingResponse

from ..chat import ChatService
from ..errors import OpenAIError
from ..protocol import ChatCompletionChunk, ChatCompletionResponse, ChatMessage
from ..request_stream import engine_failure
from .builder import ResponseBuilder
from .protocol import DeletedResponse, ResponseObject, ResponsesRequest, StreamEvent
from .store import ResponseStore, StoredResponse
from .translate import chat_request, conversation, in_responses_terms, input_messages, refuse_unsupported


class ResponsesService:
    """Serves the Responses API over a ChatService (one whose usage counts cached
    prompt tokens) and a store of responses."""

    def __init__(self, chat: ChatService, store: ResponseStore) -> None:
        self.chat = chat
        self.store = store
        #: Background responses' chunks being closed (held until closed: the loop keeps weak references).
        self._closing: set[asyncio.Future[None]] = set()

    async def create(self, request: ResponsesRequest) -> ResponseObject | StreamingResponse:
        """Answer one `POST /v1/responses`. Every refusal (400, 404, 429) comes before
        the response begins; a failure after that ends it as "failed"."""
        refuse_unsupported(request)
        if request.background:
            self._check_background(request)
        history: list[ChatMessage] = []
        if request.previous_response_id is not None:
            history = self._continued(request.previous_response_id)
        messages = [*history, *input_messages(request)]
        try:
            chunks = await self.chat.answer(chat_request(request, messages))
        except OpenAIError as error:
            raise in_responses_terms(error) from error
        assert not isinstance(chunks, ChatCompletionResponse), "the chat request is streamed"
        # Taking the first chunk starts the chat stream: from now on closing it aborts the
        # engine request, even if the events are never read (a client gone at once).
        first = await anext(chunks)
        builder = ResponseBuilder(self._response(request))
        events = self._events(builder, first, chunks, messages, request.store)
        if request.stream:
            return StreamingResponse(_sse(events), media_type="text/event-stream")
        if request.background:
            return self._in_background(builder, events, chunks)
        async for _ in events:
            pass
        response = builder.response
        if response.status == "failed":  # as a chat request failing after its first token: a 500
            assert response.error is not None
            raise OpenAIError(response.error.message, status_code=500, code=response.error.code)
        return response

    def retrieve(self, response_id: str) -> ResponseObject:
        """A stored response as it stands (a background one may still be running)."""
        return self.store.get(response_id).response

    async def cancel(self, response_id: str) -> ResponseObject:
        """Stop a background response (its engine request is aborted); it is kept as
        "cancelled". One that already ended is returned as it is."""
        entry = self.store.get(response_id)
        if not entry.response.background:
            raise OpenAIError("only responses created with background=true can be cancelled", param="response_id")
        if entry.running():
            assert entry.task is not None
            entry.task.cancel()
            await asyncio.gather(entry.task, return_exceptions=True)
            entry.response.status = "cancelled"
        return entry.response

    async def delete(self, response_id: str) -> DeletedResponse:
        """Forget a stored response (a background one still running is cancelled first)."""
        entry = self.store.pop(response_id)
        if entry.task is not None and entry.running():
            entry.task.cancel()
            await asyncio.gather(entry.task, return_exceptions=True)
        return DeletedResponse(id=response_id)

    def close(self) -> None:
        """Cancel the background responses still running (the server is stopping)."""
        for entry in self.store.running():
            assert entry.task is not None
            entry.task.cancel()

    def _check_background(self, request: ResponsesRequest) -> None:
        if request.stream:
            raise OpenAIError("background with stream=true is not supported by this server; poll "
                              "GET /v1/responses/{id} instead", param="background", code="unsupported_parameter")
        if not request.store:
            raise OpenAIError("background needs store=true (the result is fetched from the store)", param="background")
        if self.store.capacity == 0:
            raise OpenAIError("background needs a responses store, and this server keeps none "
                              "(--responses-store-size 0)", param="background")

    def _continued(self, response_id: str) -> list[ChatMessage]:
        """The conversation a previous response ended, for the next turn."""
        entry = self.store.get(response_id, param="previous_response_id")
        if entry.response.status not in ("completed", "incomplete"):
            raise OpenAIError(f"previous response '{response_id}' is {entry.response.status}; only a finished one "
                              "can be continued", param="previous_response_id")
        return [message.model_copy(deep=True) for message in entry.conversation]

    def _response(self, request: ResponsesRequest) -> ResponseObject:
        """The response object for `request`, in progress, its settings echoed."""
        return ResponseObject(
            status="in_progress", model=request.model or self.chat.serving.model.name,
            instructions=request.instructions, previous_response_id=request.previous_response_id,
            max_output_tokens=request.max_output_tokens, temperature=request.temperature, top_p=request.top_p,
            tools=request.tools, tool_choice=request.tool_choice, parallel_tool_calls=request.parallel_tool_calls,
            text=request.text, reasoning=request.reasoning, metadata=request.metadata, user=request.user,
            store=request.store, background=request.background, truncation=request.truncation,
        )

    async def _events(
        self, builder: ResponseBuilder, first: ChatCompletionChunk, chunks: AsyncIterator[ChatCompletionChunk],
        messages: list[ChatMessage], store: bool,
    ) -> AsyncIterator[StreamEvent]:
        """The response's events from its chat chunks (`first`, then `chunks`); with
        `store` it is kept (in progress from the start, then as it ended, with the
        conversation it ends)."""
        try:
            async with aclosing(chunks):  # type: ignore[type-var]
                for event in builder.start():
                    yield event
                if store and not builder.response.background:  # _in_background keeps that one
                    self.store.put(StoredResponse(builder.response, []))
                for event in builder.feed(first):
                    yield event
                async for chunk in chunks:
                    for event in builder.feed(chunk):
                        yield event
            ending = builder.finish()
        except Exception as error:  # the response has begun: it ends as failed
            ending = builder.fail(error if isinstance(error, OpenAIError) else engine_failure(error))
        if store:
            task = asyncio.current_task() if builder.response.background else None
            self.store.put(StoredResponse(builder.response, [*messages, *conversation(builder.response.output)], task))
        for event in ending:
            yield event

    def _in_background(
        self, builder: ResponseBuilder, events: AsyncIterator[StreamEvent], chunks: AsyncIterator[ChatCompletionChunk]
    ) -> ResponseObject:
        """Run the response on in a task, kept in the store; answer with it in progress."""

        async def drain() -> None:
            async for _ in events:
                pass

        task = asyncio.create_task(drain(), name=f"response {builder.response.id}")

        def close_chunks(_: asyncio.Task[None]) -> None:
            # A task cancelled before it ran never closed the chunks: close them (aborting
            # the engine request) once it is done, however it ended.
            closing = asyncio.ensure_future(chunks.aclose())  # type: ignore[attr-defined]
            self._closing.add(closing)
            closing.add_done_callback(self._closing.discard)

        task.add_done_callback(close_chunks)
        self.store.put(StoredResponse(builder.response, [], task))
        return builder.response.model_copy(deep=True)


async def _sse(events: AsyncIterator[StreamEvent]) -> AsyncIterator[str]:
    """Events as the Responses API streams them: `event: <type>` and `data: <json>`."""
    async with aclosing(events):  # type: ignore[type-var]
        async for event in events:
            yield f"event: {event.type}\ndata: {event.model_dump_json(by_alias=True)}\n\n"
