"""The emulated ascend backend serves whole models: the engine (chunked prefill, paged
cache at the backend's block sizes, MLA and MoE for DeepSeek-V3) produces the same
greedy tokens as the reference backend at bf16."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Iterator

import pytest

from accord import LLM, SamplingParams
from accord.backends import default_registry

sys.path.insert(0, str(Path(__file__).parents[1] / "engine"))  # the engine tests' tiny model builder
from engine_models import build_model_dir  # noqa: E402

GREEDY = SamplingParams(temperature=0.0, max_tokens=8, ignore_eos=True)
#: Prompts of 4 and 69 tokens: with 64-token steps the longer one is prefilled in chunks.
PROMPTS = [{"prompt_token_ids": list(range(1, length))} for length in (5, 70)]


@pytest.fixture
def emulation(monkeypatch) -> Iterator[None]:
    """ACCORD_NPU_EMULATE=1 for a registry built inside the test, rebuilt after it."""
    monkeypatch.setenv("ACCORD_NPU_EMULATE", "1")
    default_registry.cache_clear()
    yield
    default_registry.cache_clear()


def _greedy(model_dir: Path, backend: str) -> list[list[int]]:
    llm = LLM(model=str(model_dir), backend=backend, dtype="bfloat16", max_model_len=256,
              num_gpu_blocks_override=40, max_num_batched_tokens=64)
    return [list(output.outputs[0].token_ids) for output in llm.generate(PROMPTS, GREEDY, use_tqdm=False)]


@pytest.mark.slow
@pytest.mark.parametrize("architecture", ["llama", "deepseek_v3"])
def test_emulated_ascend_greedy_equals_reference(architecture, emulation, tmp_path):
    model_dir = build_model_dir(tmp_path / architecture, architecture)
    assert _greedy(model_dir, "ascend") == _greedy(model_dir, "reference")
