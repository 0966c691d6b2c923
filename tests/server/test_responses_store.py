"""The responses store and background responses, over a chat stand-in whose answer
waits for the test to let it go on: cancelling (or evicting, or deleting) a running one
closes its chunks (which aborts its engine request) and leaves it "cancelled" (or gone),
whatever the host's speed; an answer that fails after it began ends the response as
"failed"; and `--responses-store-size`, the store's bound."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from types import SimpleNamespace

import pytest

from accord.cli.commands.serve import run, server_options
from accord.cli.main import build_parser
from accord.server.errors import OpenAIError
from accord.server.protocol import ChatCompletionChunk, ChatStreamChoice, DeltaMessage, Usage
from accord.server.responses import ResponsesService, ResponseStore
from accord.server.responses.protocol import ResponsesRequest


class HeldChat:
    """A ChatService stand-in: each answer says "Hi", then waits for `release` (or,
    with `fail`, raises)."""

    def __init__(self, fail: bool = False) -> None:
        self.serving = SimpleNamespace(model=SimpleNamespace(name="m"))
        self.release = asyncio.Event()
        self.closed = 0
        if fail:
            self.release.wait = self._fail  # type: ignore[method-assign]

    @staticmethod
    async def _fail() -> None:
        raise RuntimeError("the engine died")

    async def answer(self, request) -> AsyncIterator[ChatCompletionChunk]:
        return self._chunks()

    async def _chunks(self) -> AsyncIterator[ChatCompletionChunk]:
        try:
            yield _chunk(DeltaMessage(role="assistant", content=""))
            yield _chunk(DeltaMessage(content="Hi"))
            await self.release.wait()
            yield _chunk(DeltaMessage(content="!"), finish_reason="stop")
            yield ChatCompletionChunk(id="c", model="m", choices=[],
                                      usage=Usage(prompt_tokens=3, completion_tokens=2, total_tokens=5))
        finally:
            self.closed += 1


def _chunk(delta: DeltaMessage, finish_reason: str | None = None) -> ChatCompletionChunk:
    return ChatCompletionChunk(id="c", model="m", choices=[ChatStreamChoice(index=0, delta=delta,
                                                                           finish_reason=finish_reason)])


def _background(**fields) -> ResponsesRequest:
    return ResponsesRequest(input="Hello", background=True, **fields)


async def _settle() -> None:
    # Let the background tasks run up to where they wait (a fixed number of loop turns,
    # not a wall-clock wait).
    for _ in range(10):
        await asyncio.sleep(0)


def test_a_cancelled_background_response_stops_and_is_kept_cancelled() -> None:
    async def scenario() -> None:
        chat = HeldChat()
        service = ResponsesService(chat, ResponseStore(4))  # type: ignore[arg-type]
        started = await service.create(_background())
        assert started.status == "in_progress"
        await _settle()
        assert service.retrieve(started.id).status == "in_progress" and chat.closed == 0
        cancelled = await service.cancel(started.id)
        assert cancelled.status == "cancelled" and chat.closed == 1
        assert service.retrieve(started.id).status == "cancelled"
        with pytest.raises(OpenAIError) as refused:  # a cancelled one cannot be continued
            await service.create(ResponsesRequest(input="More", previous_response_id=started.id))
        assert refused.value.param == "previous_response_id"

    asyncio.run(scenario())


def test_a_released_background_response_completes_in_the_store() -> None:
    async def scenario() -> None:
        chat = HeldChat()
        service = ResponsesService(chat, ResponseStore(4))  # type: ignore[arg-type]
        started = await service.create(_background())
        await _settle()
        chat.release.set()
        await _settle()
        done = service.retrieve(started.id)
        assert done.status == "completed" and done.output[0].content[0].text == "Hi!"
        assert done.usage.input_tokens == 3 and done.usage.output_tokens == 2
        assert (await service.cancel(started.id)).status == "completed"  # ended: returned as it is

    asyncio.run(scenario())


def test_evicting_or_deleting_a_running_background_response_cancels_it() -> None:
    async def scenario() -> None:
        chat = HeldChat()
        service = ResponsesService(chat, ResponseStore(1))  # type: ignore[arg-type]
        first = await service.create(_background())
        await _settle()
        second = await service.create(_background())  # the store holds one: the first goes
        await _settle()
        assert chat.closed == 1
        with pytest.raises(OpenAIError) as missing:
            service.retrieve(first.id)
        assert missing.value.status_code == 404
        await service.delete(second.id)
        assert chat.closed == 2
        with pytest.raises(OpenAIError):
            service.retrieve(second.id)

    asyncio.run(scenario())


def test_a_background_response_cancelled_before_it_ran_still_closes_its_chunks() -> None:
    async def scenario() -> None:
        chat = HeldChat()
        service = ResponsesService(chat, ResponseStore(4))  # type: ignore[arg-type]
        started = await service.create(_background())
        await service.cancel(started.id)  # no loop turn between: its task never started
        await _settle()
        assert chat.closed == 1 and service.retrieve(started.id).status == "cancelled"

    asyncio.run(scenario())


def test_closing_the_service_cancels_what_runs() -> None:
    async def scenario() -> None:
        chat = HeldChat()
        service = ResponsesService(chat, ResponseStore(4))  # type: ignore[arg-type]
        await service.create(_background())
        await _settle()
        service.close()
        await _settle()
        assert chat.closed == 1

    asyncio.run(scenario())


def test_a_failure_after_the_answer_began_fails_the_response() -> None:
    async def scenario() -> None:
        service = ResponsesService(HeldChat(fail=True), ResponseStore(4))  # type: ignore[arg-type]
        with pytest.raises(OpenAIError) as failed:  # not streamed: a 500, as chat's
            await service.create(ResponsesRequest(input="Hello"))
        assert failed.value.status_code == 500
        streamed = await service.create(ResponsesRequest(input="Hello", stream=True))
        events = [json.loads(block.split("data: ", 1)[1]) async for block in streamed.body_iterator]
        last = events[-1]
        assert [e["type"] for e in events][-4:] == ["response.output_text.done", "response.content_part.done",
                                                   "response.output_item.done", "response.failed"]
        assert last["response"]["status"] == "failed" and last["response"]["error"]["code"] == "engine_error"
        assert last["response"]["output"][0]["status"] == "incomplete"
        assert service.retrieve(last["response"]["id"]).status == "failed"

    asyncio.run(scenario())


def test_the_store_size_flag_reaches_the_server_options() -> None:
    assert server_options(build_parser().parse_args(["serve"])).responses_store_size == 1024
    args = build_parser().parse_args(["serve", "--responses-store-size", "3"])
    assert server_options(args).responses_store_size == 3


def test_a_negative_store_size_is_refused_before_anything_loads(capsys: pytest.CaptureFixture[str]) -> None:
    assert run(build_parser().parse_args(["serve", "--responses-store-size", "-1"])) == 2
    assert "--responses-store-size must be at least 0" in capsys.readouterr().err
