"""Fixtures for the engine tests: tiny random fp32 models (dense Llama and DeepSeek-V3)
written by transformers once per session, with the demo byte-level BPE tokenizer."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from engine_fixtures import deepseek_v3_dir, llama_dir, one_torch_thread  # noqa: F401 (fixtures)


_ENGINES: dict[tuple[str, str], object] = {}


@pytest.fixture(scope="session")
def make_llm():
    """Build (once per distinct arguments) an `accord.LLM`; every engine built here is
    checked after each test to have freed all its KV blocks."""
    from accord import LLM

    def make(model_dir: Path, **engine_args) -> LLM:
        # As JSON, so a dict-valued argument (speculative_config) keys the cache too.
        key = (str(model_dir), json.dumps(engine_args, sort_keys=True, default=str))
        if key not in _ENGINES:
            _ENGINES[key] = LLM(model=str(model_dir), **engine_args)
        return _ENGINES[key]

    return make


@pytest.fixture(autouse=True)
def every_block_is_freed_after_the_test():
    """After every engine test the free-block count is back to the total."""
    yield
    for llm in _ENGINES.values():
        manager = llm.llm_engine.scheduler.block_manager
        assert manager.num_free_blocks == manager.num_blocks, f"{manager.num_used_blocks} KV blocks leaked"
