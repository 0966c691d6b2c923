"""The chat machinery's streamed chunks of one answer, turned into the Responses API's
events (each with its sequence number) and the response they add up to: thinking as a
reasoning item, text as a message item, each tool call as a function_call item. A
non-streamed response is built the same way, its events dropped: one translation."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Literal

from ..errors import OpenAIError
from ..protocol import ChatCompletionChunk, DeltaToolCall, Usage
from .protocol import (
    ArgumentsDeltaEvent,
    ArgumentsDoneEvent,
    ContentPartEvent,
    FunctionCallItem,
    IncompleteDetails,
    InputTokensDetails,
    LifecycleEvent,
    OutputItem,
    OutputItemEvent,
    OutputMessage,
    OutputText,
    OutputTextDeltaEvent,
    OutputTextDoneEvent,
    OutputTokensDetails,
    ReasoningItem,
    ReasoningText,
    ReasoningTextDeltaEvent,
    ReasoningTextDoneEvent,
    ResponseError,
    ResponseObject,
    ResponseUsage,
    StreamEvent,
    item_id,
)

ItemKind = Literal["reasoning", "message", "function_call"]
_ID_PREFIXES = {"reasoning": "rs", "message": "msg", "function_call": "fc"}


@dataclass
class _OpenItem:
    """The output item being written: its kind, place and text (or arguments) so far."""

    kind: ItemKind
    output_index: int
    id: str
    text: str = ""
    #: A function call's id and name.
    call: dict[str, str] = field(default_factory=dict)


class ResponseBuilder:
    """Builds one response from its chat chunks; `response` is the result so far."""

    def __init__(self, response: ResponseObject) -> None:
        self.response = response
        self._sequence = 0
        self._open: _OpenItem | None = None
        self._finish_reason: str | None = None

    def start(self) -> list[StreamEvent]:
        """The stream's opening: the response created, and in progress."""
        return [self._lifecycle("response.created"), self._lifecycle("response.in_progress")]

    def feed(self, chunk: ChatCompletionChunk) -> list[StreamEvent]:
        """The events one chunk of the answer makes."""
        events: list[StreamEvent] = []
        if chunk.usage is not None:
            self.response.usage = response_usage(chunk.usage)
        for choice in chunk.choices:  # one: a response has a single answer
            delta = choice.delta
            if delta.reasoning_content:
                events += self._text("reasoning", delta.reasoning_content)
            if delta.content:
                events += self._text("message", delta.content)
            for call in delta.tool_calls or []:
                events += self._call(call)
            self._finish_reason = choice.finish_reason or self._finish_reason
        return events

    def finish(self) -> list[StreamEvent]:
        """The end of the answer: the last item closed, and the response completed (or
        incomplete, when the output reached max_output_tokens)."""
        incomplete = self._finish_reason == "length"
        # An answer with nothing in it is still a message (an empty one), as OpenAI's.
        events = self._begin("message") if self._open is None and not self.response.output else []
        events += self._close("incomplete" if incomplete else "completed")
        if incomplete:
            self.response.status = "incomplete"
            self.response.incomplete_details = IncompleteDetails(reason="max_output_tokens")
            return [*events, self._lifecycle("response.incomplete")]
        self.response.status = "completed"
        return [*events, self._lifecycle("response.completed")]

    def fail(self, error: OpenAIError) -> list[StreamEvent]:
        """The answer failed after it began: what was written so far closed as
        incomplete, and the response failed with the error."""
        events = self._close("incomplete")
        self.response.status = "failed"
        self.response.error = ResponseError(code=error.code or "server_error", message=error.message)
        return [*events, self._lifecycle("response.failed")]

    def _next(self) -> int:
        self._sequence += 1
        return self._sequence - 1

    def _lifecycle(self, kind: Any) -> LifecycleEvent:
        return LifecycleEvent(type=kind, sequence_number=self._next(), response=self.response.model_copy(deep=True))

    def _begin(self, kind: ItemKind, **call: str) -> list[StreamEvent]:
        """Close the open item, and open one of `kind`."""
        events = self._close("completed")
        item = self._open = _OpenItem(kind, len(self.response.output), item_id(_ID_PREFIXES[kind]), call=call)
        events.append(OutputItemEvent(type="response.output_item.added", sequence_number=self._next(),
                                      output_index=item.output_index, item=self._item(item, "in_progress")))
        if kind != "function_call":
            events.append(ContentPartEvent(
                type="response.content_part.added", sequence_number=self._next(), item_id=item.id,
                output_index=item.output_index, content_index=0, part=self._part(kind, ""),
            ))
        return events

    def _text(self, kind: ItemKind, text: str) -> list[StreamEvent]:
        events = [] if self._open is not None and self._open.kind == kind else self._begin(kind)
        item = self._open
        assert item is not None
        item.text += text
        delta = OutputTextDeltaEvent if kind == "message" else ReasoningTextDeltaEvent
        events.append(delta(sequence_number=self._next(), item_id=item.id, output_index=item.output_index,
                            content_index=0, delta=text))
        return events

    def _call(self, call: DeltaToolCall) -> list[StreamEvent]:
        # The chat stream opens each call with its id and name, then sends its arguments.
        events = []
        if call.id is not None:
            events = self._begin("function_call", call_id=call.id, name=call.function.name or "")
        item = self._open
        arguments = call.function.arguments or ""
        if arguments and item is not None and item.kind == "function_call":
            item.text += arguments
            events.append(ArgumentsDeltaEvent(sequence_number=self._next(), item_id=item.id,
                                              output_index=item.output_index, delta=arguments))
        return events

    def _close(self, status: Literal["completed", "incomplete"]) -> list[StreamEvent]:
        """The open item's closing events; it joins the response's output."""
        item, self._open = self._open, None
        if item is None:
            return []
        where = {"item_id": item.id, "output_index": item.output_index}
        events: list[StreamEvent] = []
        if item.kind == "function_call":
            events.append(ArgumentsDoneEvent(sequence_number=self._next(), arguments=item.text, **where))
        else:
            done = OutputTextDoneEvent if item.kind == "message" else ReasoningTextDoneEvent
            events.append(done(sequence_number=self._next(), content_index=0, text=item.text, **where))
            events.append(ContentPartEvent(type="response.content_part.done", sequence_number=self._next(),
                                           content_index=0, part=self._part(item.kind, item.text), **where))
        whole = self._item(item, status)
        self.response.output.append(whole)
        events.append(OutputItemEvent(type="response.output_item.done", sequence_number=self._next(),
                                      output_index=item.output_index, item=whole))
        return events

    @staticmethod
    def _part(kind: ItemKind, text: str) -> OutputText | ReasoningText:
        return OutputText(text=text) if kind == "message" else ReasoningText(text=text)

    @staticmethod
    def _item(item: _OpenItem, status: Literal["in_progress", "completed", "incomplete"]) -> OutputItem:
        """The item as it stands: empty while in progress, whole once done."""
        done = status != "in_progress"
        if item.kind == "message":
            return OutputMessage(id=item.id, status=status, content=[OutputText(text=item.text)] if done else [])
        if item.kind == "reasoning":
            return ReasoningItem(id=item.id, status=status, content=[ReasoningText(text=item.text)] if done else [])
        return FunctionCallItem(id=item.id, call_id=item.call["call_id"], name=item.call["name"],
                                arguments=item.text if done else "", status=status)


def response_usage(usage: Usage) -> ResponseUsage:
    """Chat usage in the Responses API's terms (input and output tokens)."""
    cached = usage.prompt_tokens_details.cached_tokens if usage.prompt_tokens_details else 0
    reasoning = usage.completion_tokens_details.reasoning_tokens if usage.completion_tokens_details else 0
    return ResponseUsage(
        input_tokens=usage.prompt_tokens, input_tokens_details=InputTokensDetails(cached_tokens=cached),
        output_tokens=usage.completion_tokens, output_tokens_details=OutputTokensDetails(reasoning_tokens=reasoning),
        total_tokens=usage.total_tokens,
    )
