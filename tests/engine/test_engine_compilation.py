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
from accord.core.worker.compilation import _replace_references, compile_forward
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


def test_every_reference_to_the_dispatcher_is_replaced_or_refused() -> None:
    """Layers reach the dispatcher through attributes, lists and dicts; each one is
    repointed, and a tuple (which cannot be) is refused instead of left behind."""
    old, new = object(), object()
    inner = ScaledNorm(old, torch.ones(4))  # type: ignore[arg-type]
    holder = torch.nn.Module()
    holder.inner = inner
    holder.by_list = [old, [old]]
    holder.by_name = {"a": old, "b": {"c": old}}
    _replace_references(holder, old, new)
    assert inner.ops is new
    assert holder.by_list == [new, [new]]
    assert holder.by_name == {"a": new, "b": {"c": new}}
    holder.frozen = (old,)
    with pytest.raises(TypeError, match="tuple"):
        _replace_references(holder, old, new)


@pytest.mark.slow
@needs_cxx
def test_compiled_forward_keeps_contract_errors() -> None:
    ops = OpDispatcher(get_backend("reference"), strict=True)
    layer = ScaledNorm(ops, torch.rand(32) + 0.5)
    forward = compile_forward(layer, ops)
    assert layer.ops is not ops  # handed the custom ops
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
