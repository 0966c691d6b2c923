"""`-O3` (compilation_config=3): the model forward compiled by inductor, contract ops
opaque, gives transformers' greedy tokens (prefill and decode graphs, a batch of
requests). The only compiling test of the suite: about a minute on a loaded 2-core host."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
import torch
from torch._dynamo.utils import counters
from engine_models import hf_greedy

from accord import SamplingParams
from accord.backends.registry import get_backend
from accord.core.worker.compilation import compile_forward
from accord.op_contracts import ContractError, OpDispatcher

MAX_NEW_TOKENS = 6

needs_cxx = pytest.mark.skipif(
    shutil.which("g++") is None and shutil.which("c++") is None and shutil.which("clang++") is None,
    reason="inductor compiles the graph to C++ on CPUs and this host has no C++ compiler",
)


class ScaledNorm(torch.nn.Module):
    """A one-layer stand-in for a model: its op calls go through the `ops` it holds."""

    def __init__(self, ops: OpDispatcher, weight: torch.Tensor) -> None:
        super().__init__()
        self.ops = ops
        self.weight = weight

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.ops.rms_norm(x * 2, self.weight, eps=1e-6) + 1


@pytest.mark.slow
def test_traced_calls_become_the_contracts_custom_ops_on_the_same_dispatcher() -> None:
    """The layer keeps the dispatcher it was built on; dynamo's graph of its forward holds
    the contract call as one torch.ops.accord node (the kernel is not traced into), and
    running that graph runs the dispatcher's kernel."""
    ops = OpDispatcher(get_backend("reference"), compiled=True)
    layer = ScaledNorm(ops, torch.rand(32) + 0.5)
    graphs: list[torch.fx.GraphModule] = []

    def keep_graph(graph: torch.fx.GraphModule, _: object) -> torch.fx.GraphModule:
        graphs.append(graph)
        return graph

    x = torch.randn(4, 32)
    with torch.inference_mode():
        got = torch.compile(layer.forward, backend=keep_graph, fullgraph=True)(x)
        want = OpDispatcher(get_backend("reference")).rms_norm(x * 2, layer.weight, eps=1e-6) + 1
    assert layer.ops is ops
    targets = [node.target for node in graphs[0].graph.nodes if node.op == "call_function"]
    assert torch.ops.accord.rms_norm.default in targets
    torch.testing.assert_close(got, want)


def test_compiling_a_model_on_an_uncompiled_dispatcher_is_refused() -> None:
    ops = OpDispatcher(get_backend("reference"))
    with pytest.raises(ValueError, match="compiled=True"):
        compile_forward(ScaledNorm(ops, torch.ones(4)), ops)


@pytest.mark.slow
@needs_cxx
def test_compiled_forward_keeps_contract_errors() -> None:
    ops = OpDispatcher(get_backend("reference"), strict=True, compiled=True)
    layer = ScaledNorm(ops, torch.rand(32) + 0.5)
    forward = compile_forward(layer, ops)
    x = torch.randn(4, 32)
    with torch.inference_mode():
        expected = ops.rms_norm(x * 2, layer.weight, eps=1e-6) + 1
        torch.testing.assert_close(forward(x), expected)
        layer.weight = torch.ones(31)
        with pytest.raises(ContractError, match="rms_norm: weight"):
            forward(x)


@pytest.mark.slow
@needs_cxx
def test_compiled_forward_gives_transformers_greedy_tokens(llama_dir: Path, make_llm) -> None:
    graphs_before = counters["stats"]["unique_graphs"]
    llm = make_llm(
        llama_dir, backend="cpu", max_model_len=256, max_num_batched_tokens=64, num_gpu_blocks_override=32,
        compilation_config=3,
    )
    prompts = [[5, 9, 13], list(range(20, 60)), [7] * 11]
    greedy = SamplingParams(temperature=0.0, max_tokens=MAX_NEW_TOKENS, ignore_eos=True)
    batched = llm.generate([{"prompt_token_ids": p} for p in prompts], greedy, use_tqdm=False)
    alone = llm.generate({"prompt_token_ids": prompts[0]}, greedy, use_tqdm=False)
    tokens = [output.outputs[0].token_ids for output in batched]
    assert tokens == hf_greedy(llama_dir, prompts, MAX_NEW_TOKENS)
    assert alone[0].outputs[0].token_ids == tokens[0]
    assert counters["stats"]["unique_graphs"] > graphs_before  # the forward did run compiled
