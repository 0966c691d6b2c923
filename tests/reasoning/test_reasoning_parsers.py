"""The reasoning parsers (vLLM's `deepseek_r1` and `qwen3`): a whole output and the same
output streamed in any chunking split into the same thinking and answer; `<think>` the
model writes itself is dropped; an output cut off before `</think>` is all thinking; a
prompt that closed the thinking makes the output all answer; the engine-side marker
logic (where the output starts, how many tokens are thinking) agrees with the parser."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from accord.core.thinking import ThinkingMarkers, ThinkingProgress, count_reasoning_tokens
from accord.server.errors import OpenAIError
from accord.server.protocol import ChatCompletionRequest
from accord.server.reasoning import refuse_reasoning_fields
from accord.server.reasoning_parsers import ReasoningSplit, ThinkTagReasoningParser, get_reasoning_parser

START, END = 1, 2
MARKERS = ThinkingMarkers(start_id=START, end_id=END)


@pytest.mark.parametrize("name", ["deepseek_r1", "qwen3"])
def test_vllms_names_are_registered(name: str) -> None:
    assert get_reasoning_parser(name) is ThinkTagReasoningParser


def test_an_unknown_parser_names_the_known_ones() -> None:
    with pytest.raises(ValueError, match="unknown reasoning parser 'nope'; known: deepseek_r1, qwen3"):
        get_reasoning_parser("nope")


@pytest.mark.parametrize(("text", "thinking", "expected"), [
    ("I think so.</think>\n\nYes.", True, ReasoningSplit("I think so.", "\n\nYes.")),
    ("<think>\nHmm.</think>Yes.", True, ReasoningSplit("\nHmm.", "Yes.")),  # Qwen3 writes <think> itself
    ("still thinking", True, ReasoningSplit("still thinking", None)),  # cut off: all thinking
    ("</think>Yes.", True, ReasoningSplit(None, "Yes.")),
    ("Yes. </think> no", False, ReasoningSplit(None, "Yes. </think> no")),  # the prompt closed the thinking
    ("a <think> b</think>c", True, ReasoningSplit("a <think> b", "c")),  # only a leading <think> is a marker
])
def test_a_whole_output_splits_into_thinking_and_answer(text: str, thinking: bool, expected: ReasoningSplit) -> None:
    assert ThinkTagReasoningParser(thinking).extract(text) == expected


def _streamed(text: str, cuts: list[int], thinking: bool) -> ReasoningSplit:
    parser = ThinkTagReasoningParser(thinking)
    bounds = [0, *sorted(set(cuts)), len(text)]
    parts = [parser.feed(text[a:b]) for a, b in zip(bounds, bounds[1:])] + [parser.finish()]
    reasoning = "".join(p.reasoning or "" for p in parts)
    content = "".join(p.content or "" for p in parts)
    return ReasoningSplit(reasoning or None, content or None)


@given(
    st.sampled_from(["<think>\n", "", "  <think>"]),
    st.text("ab<>/think\n ", max_size=12).filter(lambda t: "</think>" not in t and not t.lstrip().startswith("<think>")),
    st.booleans(),
    st.text("xy</>\n", max_size=8),
    st.lists(st.integers(0, 40), max_size=6),
    st.booleans(),
)
def test_any_chunking_of_a_stream_splits_as_the_whole_output(opening, thought, ended, answer, cuts, thinking) -> None:
    text = opening + thought + ("</think>" + answer if ended else "")
    cuts = [cut for cut in cuts if cut < len(text)]
    assert _streamed(text, cuts, thinking) == ThinkTagReasoningParser(thinking).extract(text)


@pytest.mark.parametrize(("prompt", "thinks"), [
    ([5, 6, START, 7], True),  # DeepSeek-R1: the generation prompt ends with <think>\n
    ([5, 6, 7], True),  # Qwen3 (to 2507): the model opens the thinking itself
    ([5, START, 7, 7, END, 7], False),  # Qwen3 enable_thinking=False: <think>\n\n</think>\n\n
    ([START, 3, END, 5, START], True),  # an earlier turn's thinking does not count
])
def test_where_the_output_starts_follows_the_prompts_last_marker(prompt: list[int], thinks: bool) -> None:
    assert MARKERS.thinks_after(prompt) is thinks


TURN_END = 3
TURNS = ThinkingMarkers(start_id=START, end_id=END, turn_end_ids=frozenset({TURN_END}))


@pytest.mark.parametrize(("prompt", "thinks"), [
    ([5, START, 7, END, 8, TURN_END, 5, 6], True),  # Qwen3's tool loop: the last step's thinking is in the prompt
    ([5, START, 7, END, 8, TURN_END, 5, START, 7, END, 7], False),  # ... and this turn's thinking is closed
    ([5, TURN_END, 5, START, 7], True),
])
def test_only_the_markers_of_the_prompt_s_last_turn_count(prompt: list[int], thinks: bool) -> None:
    assert TURNS.thinks_after(prompt) is thinks
    assert count_reasoning_tokens(TURNS, prompt, [9, 9, END, 4]) == (2 if thinks else 0)


def test_thinking_tokens_are_those_before_the_end_marker() -> None:
    assert count_reasoning_tokens(MARKERS, [START], [9, 9, 9, END, 4, END, 4]) == 3
    assert count_reasoning_tokens(MARKERS, [START], [9, 9]) == 2  # cut off while thinking
    assert count_reasoning_tokens(MARKERS, [END], [9, 9, END]) == 0


def test_progress_read_a_token_at_a_time_forces_the_end_at_the_budget() -> None:
    progress = ThinkingProgress.after_prompt(MARKERS, [START], budget=2)
    output: list[int] = []
    for token in (9, 9):
        assert progress.forced_token is None
        output.append(token)
        progress.observe(output)
    assert progress.forced_token == END and progress.answer_start == 3  # at the latest
    output.append(END)
    progress.observe(output)
    assert progress.forced_token is None and not progress.thinking and progress.answer_start == 3


@pytest.mark.parametrize("field", [{"reasoning_effort": "low"}, {"thinking_token_budget": 8}])
def test_a_server_without_a_reasoning_parser_refuses_the_budget_fields(field: dict) -> None:
    request = ChatCompletionRequest(messages=[{"role": "user", "content": "hi"}], **field)
    with pytest.raises(OpenAIError) as refused:
        refuse_reasoning_fields(request)
    assert refused.value.status_code == 400 and refused.value.param == next(iter(field))
