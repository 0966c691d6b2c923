"""Decode steps under LoRA replay the cpu backend's captured graph: each row's adapter
slot is one of the graph's inputs, so a replay applies the step's adapters (not those of
its capture), and a batch of base, adapter A and adapter B requests keeps the greedy
tokens of transformers with each adapter merged by PEFT."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from engine_models import build_model_dir
from lora_helpers import ADAPTER_A, ADAPTER_B, make_adapter, merged_greedy

from accord import LLM, LoRARequest, SamplingParams
from accord.backends.cpu.kernels import _native_graph, _native_lora
from accord.backends.cpu.kernels.linear import streams_bf16_weights

PROMPT = [1, 17, 33, 90, 5, 61, 7]
MAX_TOKENS = 8


@pytest.mark.slow
@pytest.mark.skipif(
    not (streams_bf16_weights() and _native_graph.available() and _native_lora.available()),
    reason="the cpu backend records decode steps only where bf16 weights stream through its native GEMM "
    "(AVX512 CPUs, with oneDNN and a C compiler)",
)
def test_replayed_decode_steps_apply_each_row_s_adapter(tmp_path: Path, forced_fp32_bf16) -> None:
    # bf16 weights computed in fp32: the projections stream through the native GEMM (which
    # a replay repeats), and fp32 numerics match PEFT's fp32 merge token for token.
    model_dir = build_model_dir(tmp_path / "llama-bf16", "llama", torch.bfloat16)
    adapters = {"a": make_adapter(model_dir, tmp_path / "a", seed=1, **ADAPTER_A),
                "b": make_adapter(model_dir, tmp_path / "b", seed=2, **ADAPTER_B)}
    loras = [None, LoRARequest("a", 1, str(adapters["a"])), LoRARequest("b", 2, str(adapters["b"]))]
    want = [merged_greedy(model_dir, adapters[name] if name else None, [PROMPT], MAX_TOKENS)[0]
            for name in (None, "a", "b")]
    assert len({tuple(tokens) for tokens in want}) == 3  # each adapter changes the tokens

    llm = LLM(str(model_dir), backend="cpu", enable_lora=True, max_loras=2, max_lora_rank=16, max_num_seqs=4,
              max_model_len=128, max_num_batched_tokens=64, max_cudagraph_capture_size=4)
    try:
        graphs = llm.llm_engine.executor.driver_worker.runner.decode_graphs
        assert graphs is not None and 4 in graphs.captured
        outputs = llm.generate([{"prompt_token_ids": PROMPT}] * 3,
                               SamplingParams(temperature=0.0, max_tokens=MAX_TOKENS, ignore_eos=True),
                               use_tqdm=False, lora_request=loras)
        assert [list(o.outputs[0].token_ids) for o in outputs] == want
        # Every decode step of the three rows (padded to 4) replayed the graph.
        assert graphs.replays >= MAX_TOKENS - 1
    finally:
        llm.llm_engine.shutdown()
