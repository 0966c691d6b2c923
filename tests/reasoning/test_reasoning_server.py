"""The chat API with a reasoning parser (`--reasoning-parser`), on tiny random models
with DeepSeek-R1's and Qwen3's chat templates, through the official openai client (the
app in process, over the real engine): the thinking comes back as
`message.reasoning_content` (and streamed `reasoning_content` deltas), the answer as
`content`; budgets (explicit, or by reasoning_effort through the server's budgets) end
the thinking at exactly N tokens; usage and /metrics count the thinking tokens; forced
tool calls are read from the answer; Qwen3's `enable_thinking=False` answers at once; the
Responses API gives the thinking as a reasoning item (streamed as reasoning_text events).

The random model would think forever, so `</think>` and EOS are biased away and the
budget is what ends the thinking. Texts are checked against the tokenizers library's own
decoding of the returned token ids."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

import httpx
import openai
import pytest
from openai.types.responses import Response, ResponseStreamEvent
from pydantic import TypeAdapter
from prometheus_client.parser import text_string_to_metric_families
from reasoning_models import THINK_END
from tokenizers import Tokenizer

from accord import AsyncLLM
from accord.core.sched.scheduler import Scheduler
from accord.server.app import create_app
from accord.server.options import ServerOptions
from accord.server.serving import ServedModel

ASK = [{"role": "user", "content": "Is 7 prime?"}]
BUDGET, ANSWER_TOKENS = 5, 4
ENGINE_ARGS = {"max_model_len": 256, "kv_cache_memory": 16 << 20, "max_num_seqs": 8}
WEATHER = {"type": "function", "function": {"name": "get_weather", "parameters": {
    "type": "object", "properties": {"city": {"enum": ["Paris", "Rome"]}}, "required": ["city"],
    "additionalProperties": False}}}


class Served:
    """The app over one tiny reasoning model's engine, in its own event loop, with an
    openai client on it and the model's tokenizer."""

    def __init__(self, model_dir: Path, parser: str) -> None:
        self.runner = asyncio.Runner()
        self.engine = self.runner.run(self._start(model_dir))
        options = ServerOptions(reasoning_parser=parser, reasoning_budgets={"low": 3, "medium": 7})
        model = ServedModel("tiny", str(model_dir), self.engine.max_model_len, self.engine.model_config.vocab_size)
        self.http = httpx.AsyncClient(transport=httpx.ASGITransport(app=create_app(self.engine, model, options)),
                                      base_url="http://test", timeout=60)
        self.client = openai.AsyncOpenAI(base_url="http://test/v1", api_key="none", http_client=self.http,
                                         max_retries=0)
        self.tokenizer = Tokenizer.from_file(str(model_dir / "tokenizer.json"))
        self.end_id = self.tokenizer.token_to_id(THINK_END)
        eos = json.loads((model_dir / "config.json").read_text())["eos_token_id"]
        #: No natural end of the thinking, nor of the output.
        self.bias = {str(self.end_id): -100, str(eos): -100}

    @staticmethod
    async def _start(model_dir: Path) -> AsyncLLM:
        return AsyncLLM.from_engine_args(str(model_dir), **ENGINE_ARGS)

    def chat(self, **fields):
        extra = fields.pop("extra_body", {})
        return self.runner.run(self.client.chat.completions.create(
            model="tiny", messages=ASK, temperature=0.0, logit_bias=self.bias,
            extra_body={"return_token_ids": True, **extra}, **fields,
        ))

    def stream(self, **fields) -> list:
        async def collect() -> list:
            return [chunk async for chunk in await self.client.chat.completions.create(
                model="tiny", messages=ASK, temperature=0.0, logit_bias=self.bias, stream=True, **fields)]

        return self.runner.run(collect())

    def metric(self, name: str, **labels: str) -> float:
        response = self.runner.run(self.http.get("/metrics"))
        samples = [s for f in text_string_to_metric_families(response.text) for s in f.samples
                   if s.name == name and labels.items() <= s.labels.items()]
        return sum(sample.value for sample in samples)

    def text(self, token_ids: list[int]) -> str:
        return self.tokenizer.decode(token_ids, skip_special_tokens=True)

    def close(self) -> None:
        self.runner.run(self.http.aclose())
        self.runner.run(self.engine.shutdown())
        self.runner.close()


@pytest.fixture(scope="module")
def r1(r1_dir: Path):
    served = Served(r1_dir, "deepseek_r1")
    yield served
    served.close()


@pytest.fixture(scope="module")
def qwen3(qwen3_dir: Path):
    served = Served(qwen3_dir, "qwen3")
    yield served
    served.close()


def test_the_thinking_is_reasoning_content_and_the_answer_content(r1: Served) -> None:
    response = r1.chat(max_completion_tokens=ANSWER_TOKENS, extra_body={"thinking_token_budget": BUDGET})
    choice = response.choices[0]
    tokens = choice.token_ids
    assert len(tokens) == BUDGET + 1 + ANSWER_TOKENS and tokens[BUDGET] == r1.end_id
    assert choice.message.reasoning_content == r1.text(tokens[:BUDGET])
    assert choice.message.content == r1.text(tokens[BUDGET + 1:])
    assert choice.finish_reason == "length"
    usage = response.usage
    assert usage.completion_tokens == len(tokens)
    assert usage.completion_tokens_details.reasoning_tokens == BUDGET


def test_streamed_reasoning_arrives_as_reasoning_content_deltas(r1: Served) -> None:
    whole = r1.chat(max_completion_tokens=ANSWER_TOKENS, extra_body={"thinking_token_budget": BUDGET})
    chunks = r1.stream(max_completion_tokens=ANSWER_TOKENS, extra_body={"thinking_token_budget": BUDGET},
                       stream_options={"include_usage": True})
    reasoning, content, usage, answer_began = "", "", None, False
    for chunk in chunks:
        usage = chunk.usage or usage
        for choice in chunk.choices:
            delta = choice.delta
            part = getattr(delta, "reasoning_content", None)
            if part:
                assert not answer_began, "thinking after the answer began"
                reasoning += part
            if delta.content:
                answer_began = True
                content += delta.content
    assert reasoning == whole.choices[0].message.reasoning_content
    assert content == whole.choices[0].message.content
    assert usage.completion_tokens_details.reasoning_tokens == BUDGET


def test_reasoning_effort_takes_its_budget_from_the_flag(r1: Served) -> None:
    response = r1.chat(max_completion_tokens=2, reasoning_effort="low")  # low=3
    tokens = response.choices[0].token_ids
    assert tokens[3] == r1.end_id and r1.end_id not in tokens[:3]
    assert response.usage.completion_tokens_details.reasoning_tokens == 3


def test_an_effort_without_a_budget_on_the_server_is_refused(r1: Served) -> None:
    with pytest.raises(openai.BadRequestError) as refused:
        r1.chat(max_completion_tokens=2, reasoning_effort="high")
    assert refused.value.body["param"] == "reasoning_effort"


@pytest.mark.slow  # the tools grammar compiles (~5-10 s on 2 cores)
def test_forced_tool_calls_are_read_from_the_answer_after_free_thinking(r1: Served) -> None:
    response = r1.chat(max_completion_tokens=60, tools=[WEATHER], tool_choice="required", parallel_tool_calls=False,
                       extra_body={"thinking_token_budget": BUDGET})
    choice = response.choices[0]
    assert choice.token_ids[BUDGET] == r1.end_id
    assert choice.message.reasoning_content == r1.text(choice.token_ids[:BUDGET])
    [call] = choice.message.tool_calls
    assert call.function.name == "get_weather" and json.loads(call.function.arguments)["city"] in ("Paris", "Rome")
    assert choice.finish_reason == "tool_calls"


def test_metrics_count_the_thinking_tokens(r1: Served) -> None:
    before = r1.metric("vllm:reasoning_tokens_total")
    r1.chat(max_completion_tokens=1, extra_body={"thinking_token_budget": BUDGET})
    after = r1.metric("vllm:reasoning_tokens_total")
    assert after - before == BUDGET


def test_qwen3_thinks_by_default_and_its_budget_holds(qwen3: Served) -> None:
    response = qwen3.chat(max_completion_tokens=2, extra_body={"thinking_token_budget": 3})
    choice = response.choices[0]
    assert choice.token_ids[3] == qwen3.end_id
    assert choice.message.reasoning_content == qwen3.text(choice.token_ids[:3])
    assert choice.message.content == qwen3.text(choice.token_ids[4:])


def test_qwen3_enable_thinking_false_answers_at_once(qwen3: Served) -> None:
    response = qwen3.chat(max_completion_tokens=6, extra_body={
        "thinking_token_budget": 2, "chat_template_kwargs": {"enable_thinking": False}})
    choice = response.choices[0]
    assert len(choice.token_ids) == 6 and qwen3.end_id not in choice.token_ids  # nothing forced
    assert choice.message.reasoning_content is None
    assert choice.message.content == qwen3.text(choice.token_ids)
    assert response.usage.completion_tokens_details.reasoning_tokens == 0


# The Responses API over the same server: the thinking as a reasoning item (the chat
# endpoint's answer to the same request is the reference).
#: reasoning.effort "low" is a 3-token thinking budget on this server (Served's budgets).
EFFORT, EFFORT_BUDGET = "low", 3
RESPONSE_PARTS = ["response.output_item.added", "response.content_part.added"]


def responses_reference(r1: Served):
    return r1.runner.run(r1.client.chat.completions.create(
        model="tiny", messages=ASK, temperature=0.0, reasoning_effort=EFFORT, max_completion_tokens=ANSWER_TOKENS))


def test_responses_thinking_is_a_reasoning_item_before_the_answer(r1: Served) -> None:
    raw = r1.runner.run(r1.client.responses.with_raw_response.create(
        model="tiny", input=ASK, temperature=0.0, reasoning={"effort": EFFORT}, max_output_tokens=ANSWER_TOKENS))
    Response.model_validate(json.loads(raw.text))
    response = raw.parse()
    expected = responses_reference(r1)
    reasoning, message = response.output
    assert reasoning.type == "reasoning" and reasoning.id.startswith("rs_") and reasoning.status == "completed"
    assert reasoning.content[0].text == expected.choices[0].message.reasoning_content
    assert message.type == "message" and response.output_text == expected.choices[0].message.content
    assert response.usage.output_tokens_details.reasoning_tokens == EFFORT_BUDGET
    assert response.usage.output_tokens == expected.usage.completion_tokens == EFFORT_BUDGET + 1 + ANSWER_TOKENS


def test_responses_streamed_thinking_comes_as_reasoning_text_events_first(r1: Served) -> None:
    async def collect() -> list:
        stream = await r1.client.responses.create(model="tiny", input=ASK, temperature=0.0, stream=True,
                                                  reasoning={"effort": EFFORT}, max_output_tokens=ANSWER_TOKENS)
        return [event async for event in stream]

    events = r1.runner.run(collect())
    adapter = TypeAdapter(ResponseStreamEvent)
    for event in events:
        adapter.validate_python(event.model_dump(mode="json", by_alias=True, exclude_unset=True))
    kinds = [event.type for event in events]
    thinking, answer = kinds.count("response.reasoning_text.delta"), kinds.count("response.output_text.delta")
    assert thinking >= 1 and answer >= 1
    assert kinds == [
        "response.created", "response.in_progress",
        *RESPONSE_PARTS, *["response.reasoning_text.delta"] * thinking, "response.reasoning_text.done",
        "response.content_part.done", "response.output_item.done",
        *RESPONSE_PARTS, *["response.output_text.delta"] * answer, "response.output_text.done",
        "response.content_part.done", "response.output_item.done",
        "response.incomplete",
    ]
    expected = responses_reference(r1).choices[0].message
    assert "".join(e.delta for e in events if e.type == "response.reasoning_text.delta") == expected.reasoning_content
    assert "".join(e.delta for e in events if e.type == "response.output_text.delta") == expected.content
    assert [e.output_index for e in events if e.type == "response.output_item.done"] == [0, 1]


# Thinking tokens per tenant (the X-Tenant-Id header), beside the per-model count.
TENANT_SERIES = "accord:tenant_reasoning_tokens_total"


def test_reasoning_tokens_are_counted_per_tenant_named_by_the_x_tenant_id_header(r1: Served) -> None:
    before = r1.metric("vllm:reasoning_tokens_total")
    headers = {"x-tenant-id": "acme"}
    r1.chat(max_completion_tokens=ANSWER_TOKENS, extra_body={"thinking_token_budget": BUDGET}, extra_headers=headers)
    r1.stream(max_completion_tokens=ANSWER_TOKENS, extra_body={"thinking_token_budget": BUDGET}, extra_headers=headers)
    r1.chat(max_completion_tokens=ANSWER_TOKENS, extra_body={"thinking_token_budget": BUDGET},
            extra_headers={"x-tenant-id": "globex"})
    r1.chat(max_completion_tokens=ANSWER_TOKENS, extra_body={"thinking_token_budget": BUDGET})  # no tenant
    assert r1.metric(TENANT_SERIES, tenant="acme", model_name="tiny") == 2 * BUDGET
    assert r1.metric(TENANT_SERIES, tenant="globex") == BUDGET
    assert r1.metric("vllm:reasoning_tokens_total") - before == 4 * BUDGET


def test_a_responses_request_counts_its_thinking_under_its_tenant(r1: Served) -> None:
    r1.runner.run(r1.client.responses.create(
        model="tiny", input=ASK, temperature=0.0, reasoning={"effort": EFFORT}, max_output_tokens=ANSWER_TOKENS,
        extra_headers={"x-tenant-id": "initech"}))
    assert r1.metric(TENANT_SERIES, tenant="initech") == EFFORT_BUDGET


def test_the_tenant_header_reaches_the_scheduler(r1: Served, monkeypatch: pytest.MonkeyPatch) -> None:
    """The scheduler's request carries the X-Tenant-Id header's tenant (its thinking cap
    is counted by it), the API key's place without one, and no tenant without either."""
    seen: list[str | None] = []
    add_request = Scheduler.add_request

    def recording(self: Scheduler, request, grammar=None) -> None:
        seen.append(request.tenant)
        add_request(self, request, grammar)

    monkeypatch.setattr(Scheduler, "add_request", recording)
    r1.chat(max_completion_tokens=1, extra_body={"thinking_token_budget": 1}, extra_headers={"x-tenant-id": "acme"})
    r1.runner.run(r1.client.responses.create(
        model="tiny", input=ASK, max_output_tokens=1, extra_headers={"x-tenant-id": "initech"}))
    r1.chat(max_completion_tokens=1)
    assert seen == ["acme", "initech", None]


def test_cache_salt_reaches_the_prefix_cache(r1: Served) -> None:
    """Equal prompts share cached blocks only under equal salts (the prefix cache's hits)."""
    long_ask = [{"role": "user", "content": " ".join(["Is seven a prime number, and why?"] * 8)}]

    def ask(salt: str) -> float:
        before = r1.metric("vllm:prefix_cache_hits_total")
        r1.runner.run(r1.client.chat.completions.create(
            model="tiny", messages=long_ask, max_completion_tokens=1, extra_body={"cache_salt": salt}))
        return r1.metric("vllm:prefix_cache_hits_total") - before

    assert ask("salt-one") == 0
    assert ask("salt-two") == 0
    assert ask("salt-one") > 0


def test_each_request_s_queue_time_is_observed_once_under_its_lane(r1: Served) -> None:
    """This server schedules fcfs: one lane, 0."""
    name = "accord:request_queue_time_by_lane_seconds_count"
    before = r1.metric(name, lane="0")
    r1.chat(max_completion_tokens=ANSWER_TOKENS, extra_body={"thinking_token_budget": BUDGET})
    assert r1.metric(name, lane="0") - before == 1


# Reasoning given back: a Responses reasoning item is the reasoning_content of the
# assistant turn after it (as vLLM reads it), and a chat message's reasoning_content
# reaches the template. The reference prompt is transformers' rendering of the same
# conversation written by hand as chat messages; Qwen3's template writes the thinking of
# a tool-calling loop's steps, DeepSeek-R1's drops it.
THOUGHT = "Seven has no divisor but one and itself."
CALL = {"type": "function_call", "call_id": "call_1", "name": "get_weather", "arguments": '{"city": "Paris"}'}
RESULT = {"type": "function_call_output", "call_id": "call_1", "output": "21 C"}
#: The same turn as chat messages (tool calls' arguments as templates read them: objects).
CHAT_CALL = {"id": "call_1", "type": "function", "function": {"name": "get_weather", "arguments": {"city": "Paris"}}}


def prompt_of(served: Served, monkeypatch: pytest.MonkeyPatch, create) -> tuple[str, object]:
    """The prompt text the engine was given for the request `create()` makes, and its answer."""
    prompts: list[list[int]] = []
    add_request = Scheduler.add_request

    def recording(self: Scheduler, request, grammar=None) -> None:
        prompts.append(list(request.prompt_token_ids))
        add_request(self, request, grammar)

    monkeypatch.setattr(Scheduler, "add_request", recording)
    answer = served.runner.run(create())
    monkeypatch.undo()
    (prompt,) = prompts
    return served.tokenizer.decode(prompt, skip_special_tokens=False), answer


def hf_prompt(model_dir: Path, messages: list[dict]) -> str:
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    return tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)


def tool_loop(thought: str) -> list[dict]:
    return [*ASK, {"role": "assistant", "content": "", "reasoning_content": thought, "tool_calls": [CHAT_CALL]},
            {"role": "tool", "content": "21 C", "tool_call_id": "call_1"}]


@pytest.mark.parametrize("reasoning", [
    {"type": "reasoning", "id": "rs_1", "summary": [], "content": [{"type": "reasoning_text", "text": THOUGHT}]},
    {"type": "reasoning", "summary": [{"type": "summary_text", "text": THOUGHT}]},
], ids=["content", "summary"])
def test_a_reasoning_item_given_back_is_the_thinking_of_the_turn_after_it(
    qwen3: Served, qwen3_dir: Path, monkeypatch: pytest.MonkeyPatch, reasoning: dict,
) -> None:
    prompt, response = prompt_of(qwen3, monkeypatch, lambda: qwen3.client.responses.create(
        model="tiny", input=[*ASK, reasoning, CALL, RESULT], temperature=0.0, reasoning={"effort": EFFORT},
        max_output_tokens=ANSWER_TOKENS))
    assert prompt == hf_prompt(qwen3_dir, tool_loop(THOUGHT))
    assert f"<think>\n{THOUGHT}\n</think>\n\n<tool_call>get_weather</tool_call>" in prompt
    # The prompt's </think> is the last step's: this turn's output still begins thinking.
    assert response.output[0].type == "reasoning"
    assert response.usage.output_tokens_details.reasoning_tokens == EFFORT_BUDGET


def test_a_stored_response_s_thinking_is_given_back_with_its_tool_call(
    qwen3: Served, qwen3_dir: Path, monkeypatch: pytest.MonkeyPatch,
) -> None:
    first = qwen3.runner.run(qwen3.client.responses.create(
        model="tiny", input=ASK, temperature=0.0, reasoning={"effort": EFFORT}, tools=[
            {"type": "function", "name": "get_weather", "parameters": WEATHER["function"]["parameters"]}],
        tool_choice="required", parallel_tool_calls=False))
    reasoning, call = first.output
    assert reasoning.type == "reasoning" and call.type == "function_call"
    prompt, _ = prompt_of(qwen3, monkeypatch, lambda: qwen3.client.responses.create(
        model="tiny", previous_response_id=first.id, max_output_tokens=1, input=[
            {"type": "function_call_output", "call_id": call.call_id, "output": "21 C"}]))
    loop = tool_loop(reasoning.content[0].text)
    loop[1]["tool_calls"] = [{**CHAT_CALL, "id": call.call_id, "function": {
        "name": call.name, "arguments": json.loads(call.arguments)}}]
    loop[2]["tool_call_id"] = call.call_id
    assert prompt == hf_prompt(qwen3_dir, loop)


def test_reasoning_items_with_no_assistant_item_after_them_are_an_assistant_turn_of_their_own(
    qwen3: Served, qwen3_dir: Path, monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Two in a row are one thinking, their texts a paragraph each."""
    items = [{"type": "reasoning", "summary": [], "content": [{"type": "reasoning_text", "text": text}]}
             for text in ("First thought.", "Second thought.")]
    prompt, _ = prompt_of(qwen3, monkeypatch, lambda: qwen3.client.responses.create(
        model="tiny", input=[*ASK, *items], max_output_tokens=1))
    thinking = {"role": "assistant", "content": "", "reasoning_content": "First thought.\n\nSecond thought."}
    assert prompt == hf_prompt(qwen3_dir, [*ASK, thinking])
    assert "<think>\nFirst thought.\n\nSecond thought.\n</think>" in prompt


@pytest.mark.parametrize("field", ["reasoning_content", "reasoning"])
def test_a_chat_message_s_reasoning_content_reaches_the_template(
    qwen3: Served, qwen3_dir: Path, monkeypatch: pytest.MonkeyPatch, field: str,
) -> None:
    messages = tool_loop(THOUGHT)
    messages[1][field] = messages[1].pop("reasoning_content")
    messages[1]["tool_calls"] = [{**CHAT_CALL, "function": {"name": "get_weather", "arguments": '{"city": "Paris"}'}}]
    prompt, _ = prompt_of(qwen3, monkeypatch, lambda: qwen3.client.chat.completions.create(
        model="tiny", messages=messages, max_completion_tokens=1))
    assert prompt == hf_prompt(qwen3_dir, tool_loop(THOUGHT))


def test_a_template_that_drops_earlier_thinking_drops_a_reasoning_item(
    r1: Served, r1_dir: Path, monkeypatch: pytest.MonkeyPatch,
) -> None:
    reasoning = {"type": "reasoning", "summary": [], "content": [{"type": "reasoning_text", "text": THOUGHT}]}
    answer = {"role": "assistant", "content": "Yes."}
    prompt, _ = prompt_of(r1, monkeypatch, lambda: r1.client.responses.create(
        model="tiny", input=[*ASK, reasoning, answer, {"role": "user", "content": "And 9?"}], max_output_tokens=1))
    assert prompt == hf_prompt(r1_dir, [*ASK, answer, {"role": "user", "content": "And 9?"}])
    assert THOUGHT not in prompt


def test_encrypted_reasoning_is_refused_naming_the_field(r1: Served) -> None:
    encrypted = {"type": "reasoning", "id": "rs_1", "summary": [], "encrypted_content": "gAAAAB..."}
    with pytest.raises(openai.BadRequestError) as refused:
        r1.runner.run(r1.client.responses.create(model="tiny", input=[*ASK, encrypted, CALL, RESULT]))
    error = refused.value.body
    assert error["param"] == "input[1].encrypted_content" and error["type"] == "invalid_request_error"
    assert "encrypted" in error["message"]


@pytest.mark.parametrize("reasoning", [
    {"type": "reasoning", "summary": [], "content": [{"type": "output_text", "text": THOUGHT}]},
    {"type": "reasoning", "summary": THOUGHT},
    {"type": "reasoning", "summary": [{"type": "summary_text"}]},
    {"type": "reasoning", "summary": [], "content": [{"type": "reasoning_text", "text": 7}]},
], ids=["content-part-type", "summary-not-a-list", "summary-without-text", "text-not-a-string"])
def test_a_malformed_reasoning_item_is_refused(r1: Served, reasoning: dict) -> None:
    with pytest.raises(openai.BadRequestError) as refused:
        r1.runner.run(r1.client.responses.create(model="tiny", input=[*ASK, reasoning, CALL, RESULT]))
    assert refused.value.body["param"] == "input"
