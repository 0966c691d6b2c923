"""The FastAPI application: OpenAI-compatible routes over one EngineClient, plus health,
Prometheus metrics and tokenizer endpoints."""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

from fastapi import APIRouter, FastAPI, Request, Response
from fastapi.openapi.utils import get_openapi
from fastapi.responses import JSONResponse, PlainTextResponse, StreamingResponse
from prometheus_client import CONTENT_TYPE_LATEST

from .. import __version__
from ..client_disconnect import cancel_on_disconnect
from ..core.engine.client import EngineClient
from .auth import ApiKeyMiddleware
from .body_limit import BodyLimitMiddleware
from .chat import ChatService
from .completions import CompletionService
from .drain import DrainDeadline
from .errors import OpenAIError, install_error_handlers, logger
from .metrics import ServerMetrics
from .options import ServerOptions
from .reasoning import served_reasoning
from .request_hints import apply_header_hints
from .responses import ResponsesService, ResponseStore
from .responses.protocol import DeletedResponse, ResponseObject, ResponsesRequest
from .protocol import (
    ChatCompletionRequest,
    ChatCompletionResponse,
    CompletionRequest,
    CompletionResponse,
    DetokenizeRequest,
    DetokenizeResponse,
    ErrorResponse,
    HealthResponse,
    LoadLoRAAdapterRequest,
    ModelCard,
    ModelList,
    TokenizeRequest,
    TokenizeResponse,
    UnloadLoRAAdapterRequest,
)
from .lora_modules import LoRAModulePath
from .serving import OpenAIServing, ServedModel
from .token_list_response import token_list_response
from .tool_parsers import get_tool_parser

#: Documented in the OpenAPI schema for every API route (FastAPI's 422 is replaced:
#: validation failures are 400s here, as in OpenAI's API).
_ERROR_RESPONSES: dict[int | str, dict[str, Any]] = {
    status: {"model": ErrorResponse} for status in (400, 401, 404, 413, 429, 500, 503)
}
#: The streamed form of a generation route's 200.
_STREAM_RESPONSE: dict[int | str, dict[str, Any]] = {
    200: {
        "content": {
            "text/event-stream": {
                "schema": {"type": "string"},
                "description": "with stream=true: `data: <chunk JSON>` events, then `data: [DONE]`",
            }
        }
    }
}

#: The Responses API's streamed 200.
_RESPONSES_STREAM: dict[int | str, dict[str, Any]] = {
    200: {
        "content": {
            "text/event-stream": {
                "schema": {"type": "string"},
                "description": "with stream=true: `event: <type>` and `data: <event JSON>` per event, "
                "response.created first and response.completed (or .incomplete, .failed) last",
            }
        }
    }
}


def create_app(
    engine: EngineClient, model: ServedModel, options: ServerOptions | None = None, drain: DrainDeadline | None = None
) -> FastAPI:
    """The server application for `engine` (an EngineClient), which it shuts down on exit.
    `drain` is expired by the server when a graceful shutdown's window runs out."""
    options = options or ServerOptions()

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        engine.watch_engine()
        yield
        responses.close()
        serving.close()
        await engine.shutdown()

    docs = {"docs_url": None, "redoc_url": None, "openapi_url": None} if options.disable_fastapi_docs else {}
    app = FastAPI(
        title="accord", version=__version__, lifespan=lifespan, description="OpenAI-compatible LLM server",
        **docs,
    )
    app.root_path = options.root_path  # as vLLM sets it: routes answer with and without the prefix
    install_error_handlers(app)
    # Outermost first: the size cap, then the key, both before any body is parsed.
    if options.api_keys:
        app.add_middleware(ApiKeyMiddleware, api_keys=options.api_keys)
    app.add_middleware(BodyLimitMiddleware, limit=options.max_request_body_bytes)
    metrics = ServerMetrics(model.name, engine.get_replica_stats, model.max_model_len)
    serving = OpenAIServing(engine, model, metrics, options, drain)
    reasoning = served_reasoning(options.reasoning_parser, options.reasoning_budgets, engine.tokenizer)
    completions = CompletionService(serving)
    chat = ChatService(serving, get_tool_parser(options.tool_call_parser), reasoning)
    # The Responses API always reports cached input tokens (OpenAI's usage has them).
    responses = ResponsesService(
        ChatService(serving, chat.tool_parser, reasoning, prompt_tokens_details=True),
        ResponseStore(options.responses_store_size),
    )
    card = ModelCard(id=model.name, root=model.name, max_model_len=model.max_model_len, description=model.description)

    api = APIRouter(prefix="/v1", responses=_ERROR_RESPONSES)

    def adapter_card(name: str) -> ModelCard:
        adapter = serving.adapters.get(name)
        assert adapter is not None
        return ModelCard(id=name, root=adapter.lora_path, parent=model.name, max_model_len=model.max_model_len)

    @api.get("/models")
    async def list_models() -> ModelList:
        """The model this server serves, then its LoRA adapters (parent: the model)."""
        return ModelList(data=[card, *(adapter_card(a.lora_name) for a in serving.adapters)])

    @api.get("/models/{model_id:path}")
    async def get_model(model_id: str) -> ModelCard:
        """One model (or adapter) by its id (404 unless it is served)."""
        return card if serving.check_model(model_id) is None else adapter_card(model_id)

    if options.allow_runtime_lora_updating:

        @api.post("/load_lora_adapter", response_class=PlainTextResponse)
        async def load_lora_adapter(request: LoadLoRAAdapterRequest) -> str:
            """Serve another LoRA adapter (vLLM's endpoint); 400 naming what is wrong with it."""
            await serving.off_loop(serving.adapters.add, LoRAModulePath(request.lora_name, request.lora_path))
            return f"Success: LoRA adapter '{request.lora_name}' added successfully."

        @api.post("/unload_lora_adapter", response_class=PlainTextResponse)
        async def unload_lora_adapter(request: UnloadLoRAAdapterRequest) -> str:
            """Stop serving a LoRA adapter (vLLM's endpoint); running requests finish on it."""
            serving.adapters.remove(request.lora_name)
            return f"Success: LoRA adapter '{request.lora_name}' removed successfully."

    @api.post("/completions", response_model=CompletionResponse, responses=_STREAM_RESPONSE)
    async def create_completion(request: CompletionRequest, raw: Request) -> CompletionResponse | StreamingResponse:
        """Complete prompts; `stream=true` answers with server-sent events."""
        apply_header_hints(request, raw.headers, options.api_keys)
        return await cancel_on_disconnect(completions.create(request), raw, logger)

    @api.post("/chat/completions", response_model=ChatCompletionResponse, responses=_STREAM_RESPONSE)
    async def create_chat_completion(
        request: ChatCompletionRequest, raw: Request
    ) -> ChatCompletionResponse | StreamingResponse:
        """Answer a conversation; `stream=true` answers with server-sent events."""
        apply_header_hints(request, raw.headers, options.api_keys)
        return await cancel_on_disconnect(chat.create(request), raw, logger)

    @api.post("/responses", response_model=ResponseObject, responses=_RESPONSES_STREAM)
    async def create_response(request: ResponsesRequest, raw: Request) -> ResponseObject | StreamingResponse:
        """Answer input items (the Responses API); `stream=true` answers with its events,
        `background=true` at once with the response in progress."""
        apply_header_hints(request, raw.headers, options.api_keys)
        return await cancel_on_disconnect(responses.create(request), raw, logger)

    @api.get("/responses/{response_id}")
    async def retrieve_response(response_id: str) -> ResponseObject:
        """A stored response (404 once evicted: see --responses-store-size)."""
        return responses.retrieve(response_id)

    @api.post("/responses/{response_id}/cancel")
    async def cancel_response(response_id: str) -> ResponseObject:
        """Stop a background response."""
        return await responses.cancel(response_id)

    @api.delete("/responses/{response_id}")
    async def delete_response(response_id: str) -> DeletedResponse:
        """Forget a stored response."""
        return await responses.delete(response_id)

    app.include_router(api)

    @app.post("/tokenize", response_model=TokenizeResponse, responses=_ERROR_RESPONSES)
    async def tokenize(request: TokenizeRequest) -> StreamingResponse:
        """Token ids of a prompt, or of chat messages rendered by the chat template
        (written a piece at a time: a prompt of megabytes has millions)."""
        serving.check_model(request.model)
        if request.messages is not None:
            tokens = await serving.render_chat(request.messages, request.add_generation_prompt)
        elif request.prompt is not None:
            tokens = await serving.tokenize(request.prompt, add_special_tokens=request.add_special_tokens)
        else:
            raise OpenAIError("send a prompt or messages to tokenize", param="prompt")
        token_strs = [serving.token_text(t) for t in tokens] if request.return_token_strs else None
        fields = {"count": len(tokens), "max_model_len": model.max_model_len, "token_strs": token_strs}
        return token_list_response(fields, "tokens", tokens)

    @app.post("/detokenize", responses=_ERROR_RESPONSES)
    async def detokenize(request: DetokenizeRequest) -> DetokenizeResponse:
        """The text of token ids."""
        serving.check_model(request.model)
        serving.check_token_ids(request.tokens, "tokens")
        text = await serving.off_loop(engine.tokenizer.decode, request.tokens, skip_special_tokens=False)
        return DetokenizeResponse(prompt=text)

    @app.get("/health")
    async def health() -> JSONResponse:
        """200 while the engine can serve, 503 once it is dead (a worker process gone)."""
        if engine.errored:
            return JSONResponse(HealthResponse(status="error").model_dump(), status_code=503)
        return JSONResponse(HealthResponse().model_dump())

    @app.get("/version")
    async def version() -> JSONResponse:
        """The engine's version, in vLLM's shape, so clients that record the server's
        version (`accord bench serve`, vLLM's `bench serve`) find it."""
        return JSONResponse({"version": __version__})

    @app.post("/reset_prefix_cache")
    async def reset_prefix_cache() -> JSONResponse:
        """Empty the prefix cache of every data-parallel replica (vLLM's admin endpoint,
        as `bench serve --reset-prefix-cache` calls it): the blocks no running request
        holds leave it; a running request's blocks stay cached until it finishes."""
        await engine.reset_prefix_cache()
        return JSONResponse({"success": True})

    @app.get("/metrics")
    async def prometheus_metrics() -> Response:
        """Prometheus metrics in the text exposition format."""
        return Response(metrics.render(), media_type=CONTENT_TYPE_LATEST)

    app.openapi = lambda: _openapi(app)  # type: ignore[method-assign]
    return app


def _openapi(app: FastAPI) -> dict[str, Any]:
    """FastAPI's schema, less the 422 it documents for every body: this server
    answers validation failures with 400."""
    if app.openapi_schema is None:
        schema = get_openapi(title=app.title, version=app.version, description=app.description, routes=app.routes)
        for operations in schema["paths"].values():
            for operation in operations.values():
                operation.get("responses", {}).pop("422", None)
        for name in ("HTTPValidationError", "ValidationError"):
            schema.get("components", {}).get("schemas", {}).pop(name, None)
        app.openapi_schema = schema
    return app.openapi_schema
