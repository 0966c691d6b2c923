"""Fixtures for the speculative decoding tests: a tiny random Llama whose next token is
mostly its current token plus one (a counting model, so drafts taken from a counting
prompt are often right and sometimes wrong), built once per session with transformers;
a shallower counting Llama of other random weights on the same vocabulary (a draft model
that agrees with the target often, not always); and engines over them, each checked
after every test to hold no KV block."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

_ENGINE_HELPERS = str(Path(__file__).resolve().parent.parent / "engine")
if _ENGINE_HELPERS not in sys.path:
    sys.path.insert(0, _ENGINE_HELPERS)

from engine_fixtures import one_torch_thread  # noqa: E402, F401 (fixture)
from spec_decode_models import write_counting_llama  # noqa: E402


@pytest.fixture(scope="session")
def counting_llama_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_counting_llama(tmp_path_factory.mktemp("models") / "counting_llama", num_layers=2, seed=0)


@pytest.fixture(scope="session")
def counting_draft_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """One layer, other weights, the target's vocabulary: a draft model for counting_llama_dir."""
    return write_counting_llama(tmp_path_factory.mktemp("models") / "counting_draft", num_layers=1, seed=1)


_ENGINES: dict[tuple, object] = {}


@pytest.fixture(scope="session")
def make_llm():
    """Build (once per distinct arguments) an `accord.LLM` on the cpu backend; every
    engine built here is checked after each test to have freed all its KV blocks."""
    from accord import LLM

    def make(model_dir: Path, **engine_args) -> LLM:
        key = (str(model_dir), json.dumps(engine_args, sort_keys=True))
        if key not in _ENGINES:
            _ENGINES[key] = LLM(model=str(model_dir), backend="cpu", **engine_args)
        return _ENGINES[key]

    return make


@pytest.fixture(autouse=True)
def every_block_is_freed_after_the_test():
    """After every test the free-block count of every engine is back to the total,
    rejected drafts' blocks included."""
    yield
    for llm in _ENGINES.values():
        manager = llm.llm_engine.scheduler.block_manager
        assert manager.num_free_blocks == manager.num_blocks, f"{manager.num_used_blocks} KV blocks leaked"
