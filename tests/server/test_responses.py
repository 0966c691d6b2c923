"""The Responses API (`/v1/responses`) through the official openai client, on the demo
model with the app in process: text in and out as the chat endpoint answers the same
conversation (the independent reference: its own tests check it), the stream's events
in OpenAI's order, each one and every response validated by the `openai` package's own
types, a manual tool loop across turns, text.format, the store's bound, background
responses, and bad input refused with a 400 naming the field."""

from __future__ import annotations

import json
import time
from pathlib import Path

import httpx
import jsonschema
import openai
import pytest
from openai.types.responses import Response, ResponseStreamEvent
from pydantic import TypeAdapter
from responses_harness import MODEL, InProcessApp, InProcessEngine
from test_server_tools import TOOLS as CHAT_TOOLS
from test_server_tools import WEATHER_PARAMETERS

#: The demo template, plus tool calls and tool results written out, so a conversation
#: that lost one renders (and is answered) differently.
TOOL_TEMPLATE = (
    "{{ bos_token }}{% for m in messages %}<|start_header_id|>{{ m['role'] }}<|end_header_id|>\n\n"
    "{% if m['content'] %}{{ m['content'] | trim }}{% endif %}"
    "{% for c in m.get('tool_calls') or [] %} call {{ c['id'] }} {{ c['function']['name'] }} "
    "{{ c['function']['arguments'] | tojson }}{% endfor %}"
    "{% if m.get('tool_call_id') %} for {{ m['tool_call_id'] }}{% endif %}<|eot_id|>{% endfor %}"
    "{% if add_generation_prompt %}<|start_header_id|>assistant<|end_header_id|>\n\n{% endif %}"
)
ASK = "What is the weather in Paris?"
#: The chat tool tests' tools, in the Responses API's flat shape.
TOOLS = [{"type": "function", **tool["function"]} for tool in CHAT_TOOLS]
EVENTS = TypeAdapter(ResponseStreamEvent)
TEXT_EVENTS_OPEN = ["response.created", "response.in_progress", "response.output_item.added",
                    "response.content_part.added"]
TEXT_EVENTS_CLOSE = ["response.output_text.done", "response.content_part.done", "response.output_item.done"]


@pytest.fixture(scope="module")
def engine(demo_model: Path):
    served = InProcessEngine(demo_model)
    yield served
    served.close()


@pytest.fixture(scope="module")
def app(engine: InProcessEngine) -> InProcessApp:
    return engine.app(chat_template=TOOL_TEMPLATE)


def create(app: InProcessApp, **fields) -> Response:
    """A response through the client, its raw JSON validated by openai's own type."""
    fields.setdefault("temperature", 0.0)
    raw = app.run(app.client.responses.with_raw_response.create(model=MODEL, **fields))
    Response.model_validate(json.loads(raw.text))  # strict: every field as the openai package types it
    return raw.parse()


def chat(app: InProcessApp, messages: list[dict], **fields):
    """The chat endpoint's greedy answer to the same conversation."""
    return app.run(app.client.chat.completions.create(model=MODEL, messages=messages, temperature=0.0, **fields))


def stream_events(app: InProcessApp, body: dict) -> list[dict]:
    """A streamed response's raw events, each checked against its `event:` line and
    validated by openai's stream event types."""
    async def collect() -> list[str]:
        async with app.http.stream("POST", "/v1/responses", json={"model": MODEL, "stream": True, **body}) as reply:
            assert reply.status_code == 200, await reply.aread()
            return [line async for line in reply.aiter_lines()]

    lines, events = app.run(collect()), []
    for block in "\n".join(lines).strip().split("\n\n"):
        name, data = block.split("\n")
        event = json.loads(data.removeprefix("data: "))
        assert name == f"event: {event['type']}"
        EVENTS.validate_python(event)
        events.append(event)
    assert [event["sequence_number"] for event in events] == list(range(len(events)))
    return events


def test_text_input_is_answered_as_chat_answers_it(app: InProcessApp) -> None:
    response = create(app, input=ASK, instructions="Answer briefly.", max_output_tokens=12)
    reference = chat(app, [{"role": "system", "content": "Answer briefly."}, {"role": "user", "content": ASK}],
                     max_completion_tokens=12)
    [message] = response.output
    assert message.type == "message" and message.role == "assistant" and message.id.startswith("msg_")
    assert response.output_text == reference.choices[0].message.content
    assert response.status == "incomplete" and response.incomplete_details.reason == "max_output_tokens"
    assert message.status == "incomplete"
    usage = response.usage
    assert (usage.input_tokens, usage.output_tokens) == (reference.usage.prompt_tokens, 12)
    assert usage.total_tokens == usage.input_tokens + 12 and usage.output_tokens_details.reasoning_tokens == 0
    assert response.id.startswith("resp_") and response.instructions == "Answer briefly."
    assert (response.max_output_tokens, response.temperature, response.tool_choice) == (12, 0.0, "auto")


def test_cached_input_tokens_are_counted(app: InProcessApp) -> None:
    # A prompt longer than a KV block, asked twice: the second finds its blocks cached.
    long_input = "Tell me about the block manager, the scheduler and the model runner. " * 3
    first = create(app, input=long_input, max_output_tokens=1)
    second = create(app, input=long_input, max_output_tokens=1)
    assert first.usage.input_tokens == second.usage.input_tokens > 32
    assert 0 < second.usage.input_tokens_details.cached_tokens < second.usage.input_tokens


def test_input_items_are_the_conversation(app: InProcessApp) -> None:
    items = [
        {"role": "developer", "content": "Answer briefly."},
        {"type": "message", "role": "user", "content": [{"type": "input_text", "text": "Hello! "},
                                                         {"type": "input_text", "text": "How are you?"}]},
        {"type": "message", "role": "assistant", "content": [{"type": "output_text", "text": "I am fine."}]},
        {"role": "user", "content": ASK},
    ]
    response = create(app, input=items, max_output_tokens=10)
    reference = chat(app, [
        {"role": "system", "content": "Answer briefly."}, {"role": "user", "content": "Hello! How are you?"},
        {"role": "assistant", "content": "I am fine."}, {"role": "user", "content": ASK},
    ], max_completion_tokens=10)
    assert response.output_text == reference.choices[0].message.content


def test_stream_events_come_in_openai_order(app: InProcessApp) -> None:
    events = stream_events(app, {"input": ASK, "max_output_tokens": 6, "temperature": 0.0})
    kinds = [event["type"] for event in events]
    deltas = kinds.count("response.output_text.delta")  # a delta per engine output with text
    assert deltas >= 1
    assert kinds == [*TEXT_EVENTS_OPEN, *["response.output_text.delta"] * deltas, *TEXT_EVENTS_CLOSE,
                     "response.incomplete"]
    whole = create(app, input=ASK, max_output_tokens=6)
    text = "".join(event["delta"] for event in events if event["type"] == "response.output_text.delta")
    assert text == whole.output_text
    added, done = events[2]["item"], events[-2]["item"]
    assert added["id"] == done["id"] and added["status"] == "in_progress" and added["content"] == []
    assert done["content"][0]["text"] == text and done["status"] == "incomplete"
    final = events[-1]["response"]
    assert final["status"] == "incomplete" and final["output"] == [done]
    assert final["usage"]["output_tokens"] == 6
    assert {event["response"]["id"] for event in (events[0], events[1], events[-1])} == {final["id"]}


def test_the_clients_stream_helper_and_stream_true_read_the_stream(app: InProcessApp) -> None:
    # The helper's final response needs response.completed: a stop string (vLLM's field)
    # taken from the greedy text ends the answer before max_output_tokens.
    stop = create(app, input=ASK, max_output_tokens=12).output_text[4:7]
    fields = {"model": MODEL, "input": ASK, "max_output_tokens": 12, "temperature": 0.0, "extra_body": {"stop": stop}}
    whole = app.run(app.client.responses.create(**fields))
    assert whole.status == "completed" and stop not in whole.output_text

    async def helper() -> Response:
        async with app.client.responses.stream(**fields) as stream:
            return await stream.get_final_response()

    async def stream_true() -> list:
        return [event async for event in await app.client.responses.create(stream=True, **fields)]

    assert app.run(helper()).output_text == whole.output_text
    events = app.run(stream_true())
    assert "".join(e.delta for e in events if e.type == "response.output_text.delta") == whole.output_text
    assert events[-1].type == "response.completed"


@pytest.mark.slow  # the tools grammar compiles (several seconds on 2 cores)
def test_a_manual_tool_loop_across_turns(app: InProcessApp) -> None:
    first = create(app, input=ASK, tools=TOOLS, tool_choice="required", parallel_tool_calls=False,
                   max_output_tokens=120, store=True)
    [call] = first.output
    assert call.type == "function_call" and call.call_id and call.id.startswith("fc_") and call.status == "completed"
    assert call.name in ("get_weather", "get_time")
    jsonschema.validate(json.loads(call.arguments), {t["name"]: t["parameters"] for t in TOOLS}[call.name])
    assert first.status == "completed"
    result = {"type": "function_call_output", "call_id": call.call_id, "output": "21 degrees and sunny"}
    second = create(app, previous_response_id=first.id, input=[result], tools=TOOLS, tool_choice="none",
                    max_output_tokens=8)
    reference = chat(app, [
        {"role": "user", "content": ASK},
        {"role": "assistant", "content": None, "tool_calls": [
            {"id": call.call_id, "type": "function", "function": {"name": call.name, "arguments": call.arguments}}]},
        {"role": "tool", "tool_call_id": call.call_id, "content": "21 degrees and sunny"},
    ], max_completion_tokens=8)
    assert second.previous_response_id == first.id
    assert second.output_text == reference.choices[0].message.content
    # The same conversation sent whole (the call replayed as an input item) is the same turn.
    replayed = create(app, input=[{"role": "user", "content": ASK}, call.model_dump(exclude_none=True), result],
                      max_output_tokens=8)
    assert replayed.output_text == second.output_text


@pytest.mark.slow  # the tools grammar compiles (several seconds on 2 cores)
def test_a_streamed_function_call(app: InProcessApp) -> None:
    events = stream_events(app, {"input": ASK, "tools": TOOLS, "tool_choice": {"type": "function", "name": "get_weather"},
                                 "max_output_tokens": 120, "temperature": 0.0})
    kinds = [event["type"] for event in events]
    assert kinds == ["response.created", "response.in_progress", "response.output_item.added",
                     "response.function_call_arguments.delta", "response.function_call_arguments.done",
                     "response.output_item.done", "response.completed"]
    added, delta, done, item_done = events[2], events[3], events[4], events[5]
    assert added["item"]["type"] == "function_call" and added["item"]["name"] == "get_weather"
    assert added["item"]["arguments"] == "" and delta["item_id"] == done["item_id"] == added["item"]["id"]
    assert delta["delta"] == done["arguments"] == item_done["item"]["arguments"]
    jsonschema.validate(json.loads(done["arguments"]), WEATHER_PARAMETERS)
    assert item_done["item"]["call_id"] == added["item"]["call_id"]


@pytest.mark.slow  # the schema's grammar compiles
def test_text_format_json_schema_output_validates(app: InProcessApp) -> None:
    schema = {"type": "object", "properties": {"city": {"enum": ["Paris", "Rome"]}, "n": {"type": "integer",
              "minimum": 0, "maximum": 9}}, "required": ["city", "n"], "additionalProperties": False}
    text = {"format": {"type": "json_schema", "name": "city", "schema": schema, "strict": True}}
    finished = [create(app, input="Name a city.", text=text, max_output_tokens=40, temperature=1.0,
                       extra_body={"seed": seed})
                for seed in range(3)]
    completed = [response for response in finished if response.status == "completed"]
    assert completed, "no constrained response ran to its end"
    for response in completed:
        jsonschema.validate(json.loads(response.output_text), schema)
        assert response.text.format.type == "json_schema"


def test_an_unstored_or_deleted_response_is_not_found(app: InProcessApp) -> None:
    unstored = create(app, input=ASK, max_output_tokens=1, store=False)
    with pytest.raises(openai.NotFoundError):
        app.run(app.client.responses.retrieve(unstored.id))
    stored = create(app, input=ASK, max_output_tokens=1)
    assert app.run(app.client.responses.retrieve(stored.id)).output_text == stored.output_text
    app.run(app.client.responses.delete(stored.id))
    with pytest.raises(openai.NotFoundError):
        app.run(app.client.responses.retrieve(stored.id))


def test_the_store_keeps_the_most_recently_used(engine: InProcessEngine) -> None:
    small = engine.app(responses_store_size=2)
    first, second = (create(small, input=ASK, max_output_tokens=1) for _ in range(2))
    small.run(small.client.responses.retrieve(first.id))  # first is now the more recently used
    third = create(small, input=ASK, max_output_tokens=1)  # evicts second
    for kept in (first, third):
        assert small.run(small.client.responses.retrieve(kept.id)).id == kept.id
    with pytest.raises(openai.NotFoundError) as missing:
        small.run(small.client.responses.retrieve(second.id))
    assert missing.value.body["type"] == "not_found_error" and second.id in missing.value.body["message"]
    with pytest.raises(openai.NotFoundError) as evicted:
        create(small, input=ASK, previous_response_id=second.id, max_output_tokens=1)
    assert evicted.value.body["param"] == "previous_response_id"


def test_a_background_response_runs_to_the_same_answer(app: InProcessApp) -> None:
    whole = create(app, input=ASK, max_output_tokens=8)
    started = create(app, input=ASK, max_output_tokens=8, background=True)
    assert started.background and started.status == "in_progress"
    deadline = time.monotonic() + 60  # a bound on the wait, not a measurement
    polled = started
    while polled.status == "in_progress" and time.monotonic() < deadline:
        polled = app.run(app.client.responses.retrieve(started.id))
    assert polled.status == "incomplete" and polled.output_text == whole.output_text
    # Cancelling one that has ended returns it as it is.
    assert app.run(app.client.responses.cancel(started.id)).status == "incomplete"
    with pytest.raises(openai.BadRequestError) as refused:
        app.run(app.client.responses.cancel(whole.id))
    assert "background" in refused.value.body["message"]


@pytest.mark.parametrize(("body", "param"), [
    ({"input": [{"role": "user", "content": [{"type": "input_image", "image_url": "x"}]}]}, "input"),
    ({"input": [{"type": "web_search_call", "id": "ws_1"}]}, "input"),
    ({"input": ASK, "include": ["message.output_text.logprobs"]}, "include"),
    ({"input": ASK, "max_output_tokens": 100000}, "max_output_tokens"),
    ({"input": ASK, "tools": TOOLS, "tool_choice": {"type": "function", "name": "nope"}}, "tool_choice"),
    ({"input": ASK, "tool_choice": "required"}, "tool_choice"),
    ({"input": ASK, "tools": [{"type": "web_search"}]}, "tools"),
    ({"input": ASK, "background": True, "stream": True}, "background"),
    ({"input": ASK, "background": True, "store": False}, "background"),
    ({"input": ASK, "text": {"format": {"type": "json_schema", "name": "x"}}}, "text"),
    ({"input": ASK, "metadata": {f"k{i}": "v" for i in range(17)}}, "metadata"),
    ({"input": ASK, "truncation": "auto"}, "truncation"),
    ({"input": ASK, "reasoning": {"effort": "low"}}, "reasoning"),
    ({"input": []}, "input"),
], ids=["image", "item-kind", "include", "too-long", "unknown-tool", "required-without-tools", "built-in-tool",
        "background-stream", "background-unstored", "schema-missing", "metadata", "truncation",
        "reasoning-without-parser", "empty"])
def test_bad_input_is_a_400_naming_the_field(app: InProcessApp, body: dict, param: str) -> None:
    reply: httpx.Response = app.post("/v1/responses", {"model": MODEL, **body})
    assert reply.status_code == 400, reply.text
    error = reply.json()["error"]
    assert error["type"] == "invalid_request_error" and error["param"] == param, error
    assert param in error["message"] or param == "input", error


def test_an_unknown_previous_response_is_a_404(app: InProcessApp) -> None:
    reply = app.post("/v1/responses", {"model": MODEL, "input": ASK, "previous_response_id": "resp_nope"})
    assert reply.status_code == 404
    assert reply.json()["error"]["param"] == "previous_response_id"
