"""Forwarding a request to an instance pool: the policy's order, a retry on the next
instance while nothing has reached the client (an instance that refuses the
connection, drops it, or answers 503), and once a stream has started a clean end: an
OpenAI error event, never a silently cut stream. PD mode first sends the request to a
prefill instance with max_tokens=1 and `kv_transfer_params.do_remote_decode`, then to a
decode instance with the `kv_transfer_params` the prefill answered (vLLM's
disaggregated proxy); without a prefill answer the decode instance computes the prompt."""

from __future__ import annotations

import json
import logging
from collections.abc import AsyncIterator, Mapping
from typing import Any

import httpx
from starlette.responses import JSONResponse, Response, StreamingResponse

from .config import RouterConfig
from .instances import Instance, InstancePool
from .policies import POLICIES, RoutedRequest

logger = logging.getLogger("accord.router")

#: Request headers handed on to an instance (its API key among them).
FORWARDED_HEADERS = ("authorization", "x-request-id", "content-type", "accept", "x-session-id", "x-tenant-id")
#: The endpoints PD mode splits into a prefill and a decode.
GENERATION_PATHS = ("/v1/completions", "/v1/chat/completions")
#: Characters per token, for estimating a request's tokens without a tokenizer.
CHARS_PER_TOKEN = 4
DEFAULT_MAX_TOKENS = 16


def error_body(message: str, status: int) -> dict[str, Any]:
    """An OpenAI-style error body."""
    kind = "service_unavailable_error" if status == 503 else "bad_gateway_error"
    return {"error": {"message": message, "type": kind, "param": None, "code": status}}


def routed_request(body: Mapping[str, Any], headers: Mapping[str, str], prefix_chars: int) -> RoutedRequest:
    """The policy's view of a request: `session_id` (body or X-Session-Id header), else
    the start of its prompt, as the affinity key; tokens estimated from its text."""
    if "messages" in body:
        text = json.dumps(body.get("messages"), ensure_ascii=False)
    else:
        text = json.dumps(body.get("prompt", ""), ensure_ascii=False)
    session = body.get("session_id") or headers.get("x-session-id")
    max_tokens = body.get("max_tokens") or body.get("max_completion_tokens") or DEFAULT_MAX_TOKENS
    tokens = len(text) // CHARS_PER_TOKEN + int(max_tokens) * int(body.get("n") or 1)
    return RoutedRequest(affinity_key=str(session) if session else text[:prefix_chars], tokens=tokens)


def prefill_body(body: Mapping[str, Any]) -> dict[str, Any]:
    """The request as the prefill instance gets it: one token, not streamed, and asked
    to keep the prompt's KV for a remote decode (vLLM's proxy)."""
    prefill = {key: value for key, value in body.items() if key not in ("stream_options", "max_completion_tokens")}
    prefill.update(max_tokens=1, stream=False, n=1, kv_transfer_params={
        "do_remote_decode": True, "do_remote_prefill": False,
        "remote_engine_id": None, "remote_block_ids": None, "remote_host": None, "remote_port": None,
    })
    return prefill


class Router:
    """The instance pools, the policy, and the HTTP client that reaches them."""

    def __init__(self, config: RouterConfig) -> None:
        self.config = config
        self.mixed = InstancePool(config.backends, "mixed")
        self.prefill = InstancePool(config.prefill, "prefill")
        self.decode = InstancePool(config.decode, "decode")
        self.policy = POLICIES[config.policy](config.load_cap)
        self.client = httpx.AsyncClient(timeout=httpx.Timeout(config.request_timeout_s, connect=5.0))

    @property
    def pools(self) -> list[InstancePool]:
        """The pools in use."""
        return [pool for pool in (self.mixed, self.prefill, self.decode) if pool]

    @property
    def serving_pool(self) -> InstancePool:
        """The pool that answers clients: the decode pool in PD mode."""
        return self.decode if self.config.pd_mode else self.mixed

    async def check_health(self) -> None:
        """One health check of every instance."""
        for pool in self.pools:
            await pool.check(self.client, self.config.health_timeout_s)

    async def close(self) -> None:
        """Close the upstream connections."""
        await self.client.aclose()

    async def handle(self, method: str, path: str, body: dict[str, Any] | None, headers: Mapping[str, str]) -> Response:
        """Answer one client request through the pools."""
        forwarded = {name: headers[name] for name in FORWARDED_HEADERS if name in headers}
        if body is None:
            return await self._forward(self.serving_pool, method, path, None, forwarded, RoutedRequest(path, 0))
        # session_id travels on: the instance keeps the session's cached KV over one-off requests'.
        routed = routed_request(body, headers, self.config.prefix_chars)
        # No decode instance in rotation: the answer is a 503 either way, and a prefill
        # now would hold its blocks for a reader that never comes (until abort_timeout_s).
        if self.config.pd_mode and path in GENERATION_PATHS and self.decode.healthy:
            params = await self._prefill(path, body, forwarded, routed)
            if params is not None:
                body = {**body, "kv_transfer_params": params}
        return await self._forward(self.serving_pool, method, path, body, forwarded, routed)

    async def _prefill(
        self, path: str, body: dict[str, Any], headers: dict[str, str], routed: RoutedRequest
    ) -> dict[str, Any] | None:
        """The kv_transfer_params a prefill instance answers for `body` (None: no
        prefill instance answered, or it rejected the request; the decode instance then
        computes the prompt itself, or answers the same error)."""
        for instance in self.policy.order(self.prefill.healthy, routed):
            instance.start(routed.tokens)
            try:
                answer = await self.client.post(instance.url + path, json=prefill_body(body), headers=headers)
            except httpx.TransportError as error:
                instance.mark_failed(f"{type(error).__name__}: {error}")
                continue
            finally:
                instance.finish(routed.tokens)
            if answer.status_code == 503:
                instance.mark_failed("answered 503")
                continue
            if answer.status_code != 200:
                return None
            return answer.json().get("kv_transfer_params")
        logger.warning("no prefill instance answered; the decode instance computes the prompt")
        return None

    async def _forward(
        self, pool: InstancePool, method: str, path: str, body: dict[str, Any] | None, headers: dict[str, str],
        routed: RoutedRequest,
    ) -> Response:
        """Send the request to the pool's instances in policy order until one answers;
        a stream is committed to its instance once its first bytes arrive."""
        streaming = bool(body and body.get("stream"))
        for instance in self.policy.order(pool.healthy, routed):
            instance.start(routed.tokens)
            request = self.client.build_request(method, instance.url + path, json=body, headers=headers)
            upstream: httpx.Response | None = None
            relayed = False
            try:
                upstream = await self.client.send(request, stream=True)
                if upstream.status_code == 503:
                    raise httpx.RemoteProtocolError("answered 503")
                if not streaming or not upstream.headers.get("content-type", "").startswith("text/event-stream"):
                    content = await upstream.aread()
                    return Response(content, upstream.status_code, media_type=upstream.headers.get("content-type"))
                chunks = upstream.aiter_raw()
                first = await anext(chunks)
                relayed = True
                return StreamingResponse(
                    self._relay(instance, upstream, first, chunks, routed.tokens),
                    status_code=upstream.status_code, media_type="text/event-stream",
                )
            except (httpx.TransportError, StopAsyncIteration) as error:
                instance.mark_failed(f"{type(error).__name__}: {error}")
            finally:
                # Cancelled too (the client left): the closed connection makes the
                # instance abort the request and free its blocks, not generate for nobody.
                if not relayed:
                    if upstream is not None:
                        await upstream.aclose()
                    instance.finish(routed.tokens)
        names = ", ".join(instance.url for instance in pool.instances)
        return JSONResponse(error_body(f"no {pool.instances[0].role} instance could take the request ({names})", 503),
                            status_code=503)

    async def _relay(
        self, instance: Instance, upstream: httpx.Response, first: bytes, chunks: AsyncIterator[bytes], tokens: int
    ) -> AsyncIterator[bytes]:
        """The stream's bytes as they come; an instance lost mid-stream ends it with an
        OpenAI error event (tokens already sent cannot be taken back, so no retry)."""
        try:
            yield first
            async for chunk in chunks:
                yield chunk
        except httpx.TransportError as error:
            instance.mark_failed(f"{type(error).__name__}: {error}")
            message = f"instance {instance.url} failed mid-stream: {type(error).__name__}"
            yield f"\n\ndata: {json.dumps(error_body(message, 502))}\n\n".encode()
        finally:
            await upstream.aclose()
            instance.finish(tokens)
