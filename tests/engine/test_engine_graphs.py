"""The model runner's decode graphs, on the CPU with a backend double whose capture
behaves like a CUDA graph's (the step runs once at capture; a replay re-runs it over
the same persistent buffers into the same output). Greedy tokens must equal eager
steps' tokens, batches pad up to their bucket, and what the buckets cannot hold (a
larger batch, a prefill) runs eagerly. Then the cpu backend's own capture (recorded
native kernel calls, `_native_graph`): the same tokens as eager steps where it records,
eager steps where it refuses."""

from __future__ import annotations

import dataclasses
import logging
from pathlib import Path
from typing import Callable

import pytest
import torch
from engine_models import build_model_dir

from accord import SamplingParams
from accord.backends import get_backend
from accord.backends.cpu import CpuBackend
from accord.backends.cpu.kernels import _native_graph
from accord.backends.cpu.kernels.linear import streams_bf16_weights
from accord.core.engine.llm import LLM

#: Decides by the CPU's ISA: `.ci/run` reruns it as on each kind of CPU (tests/conftest.py).
pytestmark = pytest.mark.isa


class GraphDoubleCpu(CpuBackend):
    """The cpu backend, claiming a real capture: records every forward's row count and
    whether it ran inside a replay."""

    captures_graphs = True
    max_graph_batch = None
    captures_compiled_steps = True

    def __init__(self) -> None:
        super().__init__()
        self.captures = 0
        self.replaying = False
        #: (rows, replayed) of every model forward after start-up.
        self.forwards: list[tuple[int, bool]] = []

    def graph_capture(self, fn: Callable[[], torch.Tensor]) -> Callable[[], torch.Tensor]:
        self.captures += 1
        static = fn()

        def replay() -> torch.Tensor:
            self.replaying = True
            try:
                static.copy_(fn())
            finally:
                self.replaying = False
            return static

        return replay


#: A fixed step token budget (the default is measured at start-up, so on a loaded machine
#: it may chunk the prompts differently from run to run, and with them the batches).
BUDGET = dict(max_num_seqs=6, max_model_len=256, max_num_batched_tokens=256)


def _llm(model_dir: Path, backend: CpuBackend, **engine_args) -> LLM:
    llm = LLM(str(model_dir), lambda: backend, **BUDGET, **engine_args)
    runner = llm.llm_engine.executor.driver_worker.runner
    forward = runner.forward  # the forward every step runs (the model's, or its compiled form)

    def recording_forward(input_ids, *args, **kwargs):
        backend.forwards.append((int(input_ids.shape[0]), backend.replaying))
        return forward(input_ids, *args, **kwargs)

    runner.forward = recording_forward
    return llm


def _generate(llm: LLM) -> list[list[int]]:
    """Six greedy requests of different lengths, so the decode batch shrinks 6 -> 1."""
    prompts = [{"prompt_token_ids": list(range(5 + i, 12 + 2 * i))} for i in range(6)]
    params = [SamplingParams(temperature=0.0, max_tokens=3 + 2 * i, ignore_eos=True) for i in range(6)]
    return [out.outputs[0].token_ids for out in llm.generate(prompts, params, use_tqdm=False)]


def _assert_all_blocks_free(llm: LLM) -> None:
    manager = llm.llm_engine.scheduler.block_manager
    assert manager.num_free_blocks == manager.num_blocks


def test_replayed_decode_steps_give_the_eager_tokens(llama_dir: Path) -> None:
    eager_backend, graph_backend = GraphDoubleCpu(), GraphDoubleCpu()
    eager = _generate(_llm(llama_dir, eager_backend, enforce_eager=True))
    llm = _llm(llama_dir, graph_backend, max_cudagraph_capture_size=4)
    runner = llm.llm_engine.executor.driver_worker.runner
    assert runner.decode_graphs is not None and runner.decode_graphs.captured == (1, 2, 4)
    assert graph_backend.captures == 3
    graph_backend.forwards.clear()
    assert _generate(llm) == eager
    _assert_all_blocks_free(llm)

    replayed = [rows for rows, replay in graph_backend.forwards if replay]
    eager_rows = [rows for rows, replay in graph_backend.forwards if not replay]
    # Decode batches of 1..4 replay in their bucket (3 rows padded to 4) ...
    assert set(replayed) == {1, 2, 4} and replayed.count(4) >= 2
    assert runner.decode_graphs.replays == len(replayed)
    # ... while the prefill and the decode steps of 5 and 6 rows ran eagerly.
    assert {5, 6} <= set(eager_rows)
    assert eager_backend.captures == 0 and all(not replay for _, replay in eager_backend.forwards)


def test_a_step_the_cpu_backend_cannot_record_runs_eagerly(llama_dir: Path, caplog) -> None:
    # fp32 weights: the projections run in oneDNN, an aten op no native replay repeats
    # (and on a CPU that does not stream bf16 weights the backend captures nothing).
    backend = CpuBackend()
    with caplog.at_level(logging.INFO, logger="accord.core.worker.model_runner"):
        llm = LLM(str(llama_dir), lambda: backend, **BUDGET)
    assert llm.llm_engine.executor.driver_worker.runner.decode_graphs is None
    if backend.captures_graphs:
        assert "decode graph for batch 1 not captured, its steps run eagerly: CaptureRefused" in caplog.text
        runner_records = [record for record in caplog.records if record.name == "accord.core.worker.model_runner"]
        assert all(record.levelno == logging.INFO for record in runner_records)


needs_native_decode_steps = pytest.mark.skipif(
    not (streams_bf16_weights() and _native_graph.available()),
    reason="the cpu backend records decode steps only where bf16 weights stream through its native GEMM "
    "(AVX512 CPUs, with oneDNN and a C compiler)",
)


@needs_native_decode_steps
def test_the_cpu_backend_replays_decode_steps_of_up_to_four_rows_with_the_eager_tokens(tmp_path: Path) -> None:
    model_dir = build_model_dir(tmp_path / "llama-bf16", "llama", torch.bfloat16)
    eager = _generate(LLM(str(model_dir), CpuBackend, **BUDGET, enforce_eager=True))
    llm = LLM(str(model_dir), CpuBackend, **BUDGET)
    graphs = llm.llm_engine.executor.driver_worker.runner.decode_graphs
    # Every bucket the bf16-weight GEMM serves is captured: at 2 and 4 rows the QKV
    # split's contiguous copies are lowered to the native row copy.
    assert graphs is not None and graphs.captured == (1, 2, 4) and not graphs.refused
    assert _generate(llm) == eager
    # The requests end two tokens apart, so batches of 4, 3 (padded to 4), 2 and 1 each
    # decode for two steps: those replayed.
    assert graphs.replays >= 8
    _assert_all_blocks_free(llm)


@needs_native_decode_steps
def test_the_cpu_backend_replays_bf16_decode_steps_on_the_native_bf16_path(tmp_path: Path, forced_native_bf16) -> None:
    # As on an AVX512-BF16 or AMX CPU (emulated here): activations, KV cache and logits in
    # bf16, the projections on bf16 in and out through the bf16-weight GEMM.
    model_dir = build_model_dir(tmp_path / "llama-bf16", "llama", torch.bfloat16)
    eager_llm = LLM(str(model_dir), CpuBackend, **BUDGET, enforce_eager=True)
    assert eager_llm.llm_engine.executor.driver_worker.runner.kv_cache_dtype == torch.bfloat16
    eager = _generate(eager_llm)
    llm = LLM(str(model_dir), CpuBackend, **BUDGET)
    graphs = llm.llm_engine.executor.driver_worker.runner.decode_graphs
    assert graphs is not None and 1 in graphs.captured, graphs and graphs.refused
    tokens = _generate(llm)
    assert tokens == eager
    assert graphs.replays >= 2
    # The independent reference: the reference backend computing the same bf16 model.
    assert tokens == _generate(LLM(str(model_dir), lambda: get_backend("reference"), **BUDGET, enforce_eager=True))
    _assert_all_blocks_free(llm)


def test_a_compiled_step_is_not_captured_by_a_backend_that_records_only_its_own_kernels(llama_dir: Path) -> None:
    backend = GraphDoubleCpu()
    runner = _llm(llama_dir, backend, max_cudagraph_capture_size=2).llm_engine.executor.driver_worker.runner
    assert runner.decode_graphs is not None and backend.captures == 2
    # As under -O: the cpu backend's graphs are its native calls, not inductor's code.
    backend.captures_compiled_steps = False
    runner.config = dataclasses.replace(runner.config, compilation_config=1)
    runner.capture_decode_graphs()
    assert runner.decode_graphs is None and backend.captures == 2
    assert CpuBackend.captures_compiled_steps is False


def test_an_aborted_request_frees_its_blocks_between_replays(llama_dir: Path) -> None:
    backend = GraphDoubleCpu()
    llm = _llm(llama_dir, backend, max_cudagraph_capture_size=4)
    engine = llm.llm_engine
    params = SamplingParams(temperature=0.0, max_tokens=50, ignore_eos=True)
    for i in range(3):
        engine.add_request(f"r{i}", {"prompt_token_ids": list(range(5, 20 + i))}, params)
    for _ in range(4):
        engine.step()
    engine.abort_request("r1")
    while engine.has_unfinished_requests():
        engine.step()
    _assert_all_blocks_free(llm)
    assert engine.executor.driver_worker.runner.decode_graphs.replays > 0
