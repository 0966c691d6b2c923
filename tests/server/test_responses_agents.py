"""The OpenAI Agents SDK (`openai-agents`) runs a two-tool agent against the app: its
first turn must call a tool (tool_choice required), the SDK runs the function and sends
the result back as a function_call_output item, and its second turn (the SDK resets
tool_choice to auto) answers in text. Skipped, saying so, where the SDK is not installed."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Literal

import jsonschema
import pytest
from responses_harness import MODEL, InProcessEngine

agents = pytest.importorskip("agents", reason="the OpenAI Agents SDK (pip install openai-agents) is not installed")

WEATHER_SCHEMA = {"city": {"enum": ["Paris", "Rome"]}}


@pytest.fixture(scope="module")
def engine(demo_model: Path):
    served = InProcessEngine(demo_model)
    yield served
    served.close()


@pytest.mark.slow  # the tools grammar compiles, and the agent takes two turns
def test_a_two_tool_agent_runs_against_the_server(engine: InProcessEngine) -> None:
    from agents import Agent, ModelSettings, OpenAIResponsesModel, Runner, function_tool, set_tracing_disabled

    set_tracing_disabled(True)  # traces would be sent to OpenAI's servers
    app = engine.app()
    ran: list[tuple[str, dict]] = []

    @function_tool
    def get_weather(city: Literal["Paris", "Rome"]) -> str:
        """The weather in a city."""
        ran.append(("get_weather", {"city": city}))
        return f"sunny in {city}"

    @function_tool
    def get_time() -> str:
        """The time now."""
        ran.append(("get_time", {}))
        return "noon"

    agent = Agent(
        name="assistant", instructions="Answer with the tools.", tools=[get_weather, get_time],
        model=OpenAIResponsesModel(model=MODEL, openai_client=app.client),
        # The random model never ends a text by itself, and the SDK takes a response cut
        # at max_tokens for a failure: stop strings (vLLM's field) end the answer, digits,
        # which the call (forced by the tools grammar) cannot contain.
        model_settings=ModelSettings(tool_choice="required", parallel_tool_calls=False, max_tokens=120,
                                     temperature=0.0, extra_body={"stop": list("0123456789")}),
    )
    result = app.run(Runner.run(agent, "What is the weather in Paris?", max_turns=3))
    first, second = result.raw_responses
    [call] = [item for item in first.output if item.type == "function_call"]
    assert ran == [(call.name, json.loads(call.arguments))]
    if call.name == "get_weather":
        jsonschema.validate(json.loads(call.arguments), {"type": "object", "properties": WEATHER_SCHEMA})
    assert [item.type for item in second.output] == ["message"]
    assert result.final_output and result.final_output == second.output[0].content[0].text
