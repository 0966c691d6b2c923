"""Asynchronous loads from the CPU KV tier (vLLM's load_async): a request whose prefix
the tier holds waits, WAITING_FOR_REMOTE_KVS, while the worker half's reader thread
copies it into its blocks, and the other requests' steps go on meanwhile. A gate on
the worker half's loads decides when a load runs (or fails), so nothing here depends
on timing. The reference is an engine with no tier."""

from __future__ import annotations

import random
import threading
from pathlib import Path

import pytest

from accord import LLM
from accord.core.engine.llm_engine import LLMEngine
from accord.core.kv_transfer.base import KVConnectorMetadata
from accord.core.sampling_params import SamplingParams
from accord.core.sched.request import RequestStatus

BLOCK = 16
#: A device pool of 16 blocks; two requests run at once.
ENGINE_ARGS = dict(backend="cpu", max_model_len=128, num_gpu_blocks_override=16, max_num_batched_tokens=128,
                   block_size=BLOCK, max_num_seqs=2)
GREEDY = SamplingParams(temperature=0.0, max_tokens=4, ignore_eos=True)
#: The other request's: it decodes for a while beside the load.
LONG = SamplingParams(temperature=0.0, max_tokens=8, ignore_eos=True)
#: The tiny Llama's KV block over all layers: the tier holds 32.
BLOCK_BYTES = 8 << 10
TIER_SLOTS = 32
#: Steps a test waits for something that takes a few at most (a bound, not a timing).
MAX_STEPS = 200


def _prompts(count: int, length: int, seed: int = 0) -> list[dict]:
    rng = random.Random(seed)
    return [{"prompt_token_ids": [rng.randrange(3, 200) for _ in range(length)]} for _ in range(count)]


#: The prefix the tier serves (six full blocks and a last token), and other prompts.
PREFIX = _prompts(1, 6 * BLOCK + 1)[0]
OTHER = _prompts(1, 2 * BLOCK + 5, seed=1)[0]


def _tier(async_load: bool = True) -> dict:
    return {"kv_connector": "OffloadingConnector", "kv_role": "kv_both", "kv_connector_extra_config": {
        "cpu_bytes_to_use": TIER_SLOTS * BLOCK_BYTES, "async_load": async_load}}


@pytest.fixture(scope="module")
def plain(llama_dir: Path) -> LLM:
    return LLM(str(llama_dir), **ENGINE_ARGS)


def _tokens(llm: LLM, prompt: dict, params: SamplingParams = GREEDY) -> list[int]:
    return llm.generate([prompt], params)[0].outputs[0].token_ids


def _tiered(llama_dir: Path, async_load: bool = True) -> LLM:
    """An engine with the CPU tier whose device cache has lost PREFIX, which the tier holds."""
    llm = LLM(str(llama_dir), kv_transfer_config=_tier(async_load), **ENGINE_ARGS)
    _tokens(llm, PREFIX)
    llm.llm_engine.reset_prefix_cache()  # the device's copy goes; the tier keeps its own
    assert llm.llm_engine.scheduler.block_manager.find_cached_prefix(PREFIX["prompt_token_ids"], 6 * BLOCK) == []
    return llm


@pytest.fixture
def tiered(llama_dir: Path) -> LLM:
    return _tiered(llama_dir)


class LoadGate:
    """Holds the worker half's loads (copies into device blocks) until `opened` is
    set, then runs them, or raises `error` instead when one is given."""

    def __init__(self, engine: LLMEngine, monkeypatch: pytest.MonkeyPatch, error: Exception | None = None) -> None:
        self.started, self.opened = threading.Event(), threading.Event()
        self.error = error
        worker = engine.executor.driver_worker.runner.kv_connector
        real = worker.start_load_kv

        def start_load_kv(metadata: KVConnectorMetadata) -> None:
            if metadata.to_device or metadata.from_disk:  # type: ignore[attr-defined]
                self.started.set()
                if not self.opened.wait(timeout=60):
                    raise TimeoutError("the test never opened the load gate")
                if self.error is not None:
                    raise self.error
            real(metadata)

        monkeypatch.setattr(worker, "start_load_kv", start_load_kv)


@pytest.fixture
def gates() -> list[LoadGate]:
    """Every gate a test made, opened at its end (no reader thread is left waiting)."""
    made: list[LoadGate] = []
    yield made
    for gate in made:
        gate.opened.set()


def _step_until(engine: LLMEngine, done, outputs: dict[str, list[int]] | None = None) -> None:
    """Step `engine` until `done()`, collecting finished requests' tokens in `outputs`."""
    for _ in range(MAX_STEPS):
        if done():
            return
        for output in engine.step():
            if output.finished and outputs is not None:
                outputs[output.request_id] = output.outputs[0].token_ids
    raise AssertionError(f"not done after {MAX_STEPS} steps")


def _status(engine: LLMEngine, prompt: dict) -> RequestStatus:
    (request,) = [r for r in engine.scheduler.requests.values() if r.prompt_token_ids == prompt["prompt_token_ids"]]
    return request.status


def _assert_nothing_held(engine: LLMEngine) -> None:
    """Every device block is free and no load or transfer is pending."""
    manager = engine.scheduler.block_manager
    assert manager.num_free_blocks == manager.num_blocks
    assert not engine.awaits_transfers()


def _start_gated_load(engine: LLMEngine, monkeypatch: pytest.MonkeyPatch, gates: list[LoadGate]) -> LoadGate:
    """Add PREFIX as "loaded" and step until its load has started and waits at a gate."""
    gates.append(gate := LoadGate(engine, monkeypatch))
    engine.add_request("loaded", PREFIX, GREEDY)
    engine.step()
    assert gate.started.wait(timeout=60)
    assert _status(engine, PREFIX) is RequestStatus.WAITING_FOR_REMOTE_KVS
    return gate


@pytest.mark.parametrize("async_load", [True, False])
def test_a_tier_hit_gives_the_same_tokens_with_nothing_recomputed(llama_dir: Path, plain: LLM, async_load: bool) -> None:
    llm = _tiered(llama_dir, async_load)
    engine = llm.llm_engine
    computed = engine.stats.computed_prompt_tokens
    again = llm.generate([PREFIX], GREEDY)[0]
    assert again.outputs[0].token_ids == _tokens(plain, PREFIX)
    # Six blocks loaded, off the step path or in it: only the last token was computed.
    assert engine.stats.computed_prompt_tokens - computed == 1
    assert again.num_cached_tokens == 6 * BLOCK
    _assert_nothing_held(engine)


def test_a_loading_request_does_not_hold_up_another_requests_decode(
    tiered: LLM, plain: LLM, monkeypatch: pytest.MonkeyPatch, gates: list[LoadGate]
) -> None:
    engine = tiered.llm_engine
    gates.append(gate := LoadGate(engine, monkeypatch))
    computed = engine.stats.computed_prompt_tokens
    outputs: dict[str, list[int]] = {}
    engine.add_request("other", OTHER, LONG)
    engine.add_request("loaded", PREFIX, GREEDY)
    # The other request runs to its last token while the load cannot end.
    _step_until(engine, lambda: "other" in outputs, outputs)
    assert gate.started.is_set()
    assert _status(engine, PREFIX) is RequestStatus.WAITING_FOR_REMOTE_KVS
    assert outputs["other"] == _tokens(plain, OTHER, LONG)
    gate.opened.set()
    _step_until(engine, lambda: "loaded" in outputs, outputs)
    assert outputs["loaded"] == _tokens(plain, PREFIX)
    # The other prompt in full, and the loaded request's last token alone.
    assert engine.stats.computed_prompt_tokens - computed == len(OTHER["prompt_token_ids"]) + 1
    _assert_nothing_held(engine)


def test_an_abort_while_loading_frees_every_block_once_the_load_ends(
    tiered: LLM, plain: LLM, monkeypatch: pytest.MonkeyPatch, gates: list[LoadGate]
) -> None:
    engine = tiered.llm_engine
    manager = engine.scheduler.block_manager
    gate = _start_gated_load(engine, monkeypatch, gates)
    # The six blocks the load fills, no more.
    assert manager.num_free_blocks == manager.num_blocks - 6
    (aborted,) = engine.abort_request("loaded")
    assert aborted.finished and aborted.outputs[0].finish_reason == "abort"
    assert not engine.has_unfinished_requests()
    # The load still writes them: held until it ends.
    assert manager.num_free_blocks == manager.num_blocks - 6 and engine.awaits_transfers()
    gate.opened.set()
    late: list = []
    _step_until(engine, lambda: not engine.awaits_transfers(), None)
    for _ in range(3):
        late += engine.step()
    assert late == []  # the load's end is dropped: nothing more of the aborted request
    assert manager.num_free_blocks == manager.num_blocks and not engine.scheduler.requests
    # Its blocks were never cached; the tier still serves the prefix.
    computed = engine.stats.computed_prompt_tokens
    assert _tokens(tiered, PREFIX) == _tokens(plain, PREFIX)
    assert engine.stats.computed_prompt_tokens - computed == 1


def test_a_failed_load_falls_back_to_computing_the_prefix(
    tiered: LLM, plain: LLM, monkeypatch: pytest.MonkeyPatch, gates: list[LoadGate]
) -> None:
    engine = tiered.llm_engine
    gates.append(gate := LoadGate(engine, monkeypatch, error=OSError("injected read failure")))
    gate.opened.set()
    computed = engine.stats.computed_prompt_tokens
    assert _tokens(tiered, PREFIX) == _tokens(plain, PREFIX)
    assert gate.started.is_set() and engine.stats.kv_loads_failed == 1
    # Recomputed in full: the failed blocks are forgotten, not asked for again.
    assert engine.stats.computed_prompt_tokens - computed == len(PREFIX["prompt_token_ids"])
    _assert_nothing_held(engine)


def test_the_slots_a_load_reads_survive_the_tier_cycling_meanwhile(
    tiered: LLM, plain: LLM, monkeypatch: pytest.MonkeyPatch, gates: list[LoadGate]
) -> None:
    engine = tiered.llm_engine
    tier = engine.scheduler.kv_connector
    gate = _start_gated_load(engine, monkeypatch, gates)
    # While the load waits, 36 new blocks go through the 32-slot tier: every slot but
    # the six the load reads is reassigned (they would be too, were they not kept).
    stored = tier.blocks_stored
    others = _prompts(12, 3 * BLOCK + 1, seed=2)
    outputs: dict[str, list[int]] = {}
    for index, prompt in enumerate(others):
        engine.add_request(f"other-{index}", prompt, GREEDY)
    _step_until(engine, lambda: len(outputs) == len(others), outputs)
    assert tier.blocks_stored - stored > TIER_SLOTS
    assert _status(engine, PREFIX) is RequestStatus.WAITING_FOR_REMOTE_KVS
    gate.opened.set()
    _step_until(engine, lambda: "loaded" in outputs, outputs)
    assert outputs["loaded"] == _tokens(plain, PREFIX)
    assert [outputs[f"other-{index}"] for index in range(len(others))] == [_tokens(plain, p) for p in others]
