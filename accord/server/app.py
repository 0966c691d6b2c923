"""The FastAPI application: OpenAI-compatible routes over one AsyncLLM, plus health,
Prometheus metrics and tokenizer endpoints."""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

from fastapi import APIRouter, Depends, FastAPI, Request, Response
from fastapi.responses import StreamingResponse
from prometheus_client import CONTENT_TYPE_LATEST

from .. import __version__
from ..core.async_engine import AsyncLLM
from .auth import api_key_checker
from .chat import ChatService
from .completions import CompletionService
from .disconnect import cancel_on_disconnect
from .errors import OpenAIError, install_error_handlers
from .metrics import ServerMetrics
from .protocol import (
    ChatCompletionRequest,
    ChatCompletionResponse,
    CompletionRequest,
    CompletionResponse,
    DetokenizeRequest,
    DetokenizeResponse,
    ErrorResponse,
    ModelCard,
    ModelList,
    TokenizeRequest,
    TokenizeResponse,
)
from .serving import OpenAIServing, ServedModel

#: Documented in the OpenAPI schema for every API route.
_ERROR_RESPONSES = {status: {"model": ErrorResponse} for status in (400, 401, 429, 500)}


def create_app(
    engine: AsyncLLM, model: ServedModel, *, api_key: str | None = None, max_waiting_requests: int | None = None
) -> FastAPI:
    """The server application for `engine` (an AsyncLLM), which it shuts down on exit."""

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        engine.watch_engine()
        yield
        await engine.shutdown()

    app = FastAPI(title="accord", version=__version__, lifespan=lifespan, description="OpenAI-compatible LLM server")
    install_error_handlers(app)
    metrics = ServerMetrics(model.name, engine.get_stats)
    serving = OpenAIServing(engine, model, metrics, max_waiting_requests)
    completions, chat = CompletionService(serving), ChatService(serving)

    api = APIRouter(prefix="/v1", dependencies=[Depends(api_key_checker(api_key))], responses=_ERROR_RESPONSES)

    @api.get("/models")
    async def list_models() -> ModelList:
        """The one model this server serves."""
        card = ModelCard(id=model.name, root=model.root, max_model_len=model.max_model_len, description=model.description)
        return ModelList(data=[card])

    @api.post("/completions", response_model=CompletionResponse)
    async def create_completion(request: CompletionRequest, raw: Request) -> CompletionResponse | StreamingResponse:
        """Complete prompts; `stream=true` answers with server-sent events."""
        return await cancel_on_disconnect(completions.create(request), raw)

    @api.post("/chat/completions", response_model=ChatCompletionResponse)
    async def create_chat_completion(
        request: ChatCompletionRequest, raw: Request
    ) -> ChatCompletionResponse | StreamingResponse:
        """Answer a conversation; `stream=true` answers with server-sent events."""
        return await cancel_on_disconnect(chat.create(request), raw)

    app.include_router(api)

    @app.post("/tokenize", responses=_ERROR_RESPONSES)
    async def tokenize(request: TokenizeRequest) -> TokenizeResponse:
        """Token ids of a prompt, or of chat messages rendered by the chat template."""
        serving.check_model(request.model)
        if request.messages is not None:
            tokens = serving.render_chat(request.messages, request.add_generation_prompt)
        elif request.prompt is not None:
            tokens = list(engine.tokenizer.encode(request.prompt, add_special_tokens=request.add_special_tokens))
        else:
            raise OpenAIError("send a prompt or messages to tokenize", param="prompt")
        return TokenizeResponse(count=len(tokens), max_model_len=model.max_model_len, tokens=tokens)

    @app.post("/detokenize", responses=_ERROR_RESPONSES)
    async def detokenize(request: DetokenizeRequest) -> DetokenizeResponse:
        """The text of token ids."""
        serving.check_model(request.model)
        serving.check_token_ids(request.tokens, "tokens")
        return DetokenizeResponse(prompt=engine.tokenizer.decode(request.tokens, skip_special_tokens=False))

    @app.get("/health")
    async def health() -> Response:
        """200 while the engine can serve, 503 once it is dead (a worker process gone)."""
        return Response(status_code=503 if engine.errored else 200)

    @app.get("/metrics")
    async def prometheus_metrics() -> Response:
        """Prometheus metrics in the text exposition format."""
        return Response(metrics.render(), media_type=CONTENT_TYPE_LATEST)

    return app
