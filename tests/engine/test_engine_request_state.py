"""One owner per piece of request state: the scheduler hands plain RequestUpdates out
of `update_from_output`, and the output processor keeps its own per-request state
(tokens, text, stop strings, finish reasons), returning the ids the scheduler must
abort when a stop string ends a sample."""

from __future__ import annotations

import dataclasses

import pytest

from accord.core.engine.output_processor import OutputProcessor
from accord.core.sampling_params import SamplingParams
from accord.core.sched.block_manager import BlockManager
from accord.core.sched.output import ModelRunnerOutput, RequestUpdate
from accord.core.sched.request import Request
from accord.core.sched.scheduler import Scheduler
from accord.demo.tokenizer import build_demo_tokenizer

EOS = 2


@pytest.fixture(scope="module")
def tokenizer():
    return build_demo_tokenizer()


def sampled(req_ids: list[str], token: int) -> ModelRunnerOutput:
    return ModelRunnerOutput(req_ids=req_ids, sampled_token_ids=[token] * len(req_ids),
                             logprobs=[None] * len(req_ids), top_logprobs=[None] * len(req_ids))


def test_update_from_output_returns_plain_updates_for_every_request_the_step_touched() -> None:
    scheduler = Scheduler(BlockManager(64, 4), 10, 8, max_model_len=64, eos_token_ids=[EOS])
    short = Request("short", [5, 6, 7], SamplingParams(max_tokens=1, ignore_eos=True), arrival_order=0)
    long = Request("long", list(range(10, 30)), SamplingParams(max_tokens=4), arrival_order=1)
    scheduler.add_request(short)
    scheduler.add_request(long)
    step = scheduler.schedule()
    assert step.num_scheduled_tokens == {"short": 3, "long": 7}  # the long prompt is chunked
    updates = scheduler.update_from_output(step, sampled(["short"], 9))
    assert updates == [
        RequestUpdate("short", new_token_ids=[9], new_logprobs=[None], new_top_logprobs=[None],
                      finish_reason="length"),
        RequestUpdate("long"),  # computed part of its prompt, sampled nothing
    ]
    values = [getattr(update, f.name) for update in updates for f in dataclasses.fields(update)]
    assert not any(isinstance(value, Request) for value in values)
    assert "short" not in scheduler.requests and "long" in scheduler.requests


def add(processor: OutputProcessor, tokenizer, **params) -> tuple[str, list[int]]:
    prompt = tokenizer.encode("Hello").ids
    # As the engine hands them over: each sample's params know its stop tokens (EOS included).
    processor.add_request("r", "Hello", prompt, [("r.0", SamplingParams(**params).for_child(0, {EOS}))], 0.0)
    return "r.0", prompt


def feed(processor: OutputProcessor, req_id: str, tokens: list[int], last: RequestUpdate | None = None):
    """Updates of one token each; `last` (if given) replaces the last one's finish."""
    processed = []
    for position, token in enumerate(tokens):
        update = RequestUpdate(req_id, new_token_ids=[token], new_logprobs=[None], new_top_logprobs=[None])
        if last is not None and position == len(tokens) - 1:
            update.finish_reason, update.stop_reason = last.finish_reason, last.stop_reason
        processed.append(processor.process([update], now=float(position)))
    return processed


def test_a_stop_string_finishes_the_sample_and_asks_the_scheduler_to_abort_it(tokenizer) -> None:
    processor = OutputProcessor(tokenizer)
    req_id, _ = add(processor, tokenizer, stop=["two"], max_tokens=50)
    tokens = tokenizer.encode(" one two three").ids
    results = feed(processor, req_id, tokens)
    stopped_at = next(i for i, r in enumerate(results) if r.req_ids_to_abort)
    assert results[stopped_at].req_ids_to_abort == [req_id]
    final = results[stopped_at].outputs[0]
    assert final.finished and final.outputs[0].finish_reason == "stop" and final.outputs[0].stop_reason == "two"
    assert final.outputs[0].text == tokenizer.decode(tokenizer.encode(" one ").ids)
    assert "r" not in processor
    # Tokens the scheduler computed before it heard of the abort are dropped.
    assert all(not r.outputs for r in results[stopped_at + 1 :])


def test_a_stop_string_outranks_max_tokens_reached_by_the_same_token(tokenizer) -> None:
    processor = OutputProcessor(tokenizer)
    tokens = tokenizer.encode(" one two").ids
    req_id, _ = add(processor, tokenizer, stop=["two"], max_tokens=len(tokens))
    results = feed(processor, req_id, tokens, last=RequestUpdate(req_id, finish_reason="length"))
    completion = results[-1].outputs[0].outputs[0]
    assert (completion.finish_reason, completion.stop_reason) == ("stop", "two")
    assert results[-1].req_ids_to_abort == []  # the scheduler had already finished it


def test_a_stop_token_outranks_a_stop_string_completed_by_the_same_token(tokenizer) -> None:
    processor = OutputProcessor(tokenizer)
    tokens = tokenizer.encode(" one two").ids
    stop_token = tokens[-1]
    req_id, _ = add(processor, tokenizer, stop=["two"], stop_token_ids=[stop_token])
    results = feed(processor, req_id, tokens, last=RequestUpdate(req_id, finish_reason="stop", stop_reason=stop_token))
    completion = results[-1].outputs[0].outputs[0]
    assert (completion.finish_reason, completion.stop_reason) == ("stop", stop_token)
    assert results[-1].req_ids_to_abort == []


def test_abort_finishes_every_unfinished_sample_and_names_them_for_the_scheduler(tokenizer) -> None:
    processor = OutputProcessor(tokenizer)
    prompt = tokenizer.encode("Hello").ids
    processor.add_request("r", "Hello", prompt, [("r.0", SamplingParams()), ("r.1", SamplingParams())], 0.0)
    processor.process([RequestUpdate("r.0", new_token_ids=[5], new_logprobs=[None], new_top_logprobs=[None],
                                     finish_reason="length")], now=1.0)
    assert processor.sample_ids(["r", "unknown"]) == ["r.1"]
    (output,) = processor.abort(["r"], now=2.0)
    assert [c.finish_reason for c in output.outputs] == ["length", "abort"]
    assert output.finished and "r" not in processor
