"""The prefix cache is keyed by adapter: the same tokens under two adapters (or an
adapter and the base model) never share a KV block, since their KV differs; under one
adapter they do."""

from __future__ import annotations

from pathlib import Path

import pytest

from accord import LLM, LoRARequest, SamplingParams
from accord.core.sched.block_manager import BlockManager, chain_root

TOKENS = list(range(1, 17))


@pytest.mark.parametrize("algo", ["sha256", "builtin"])
def test_a_chain_cached_under_one_adapter_is_found_only_under_it(algo: str) -> None:
    manager = BlockManager(16, 4, hash_algo=algo)
    assert manager.allocate("a", len(TOKENS))
    manager.cache_full_blocks("a", TOKENS, len(TOKENS), chain_root(1))
    assert len(manager.find_cached_prefix(TOKENS, len(TOKENS), chain_root(1))) == 4
    assert manager.find_cached_prefix(TOKENS, len(TOKENS), chain_root(2)) == []
    assert manager.find_cached_prefix(TOKENS, len(TOKENS)) == []  # the base model's chain


def test_a_chain_cached_for_the_base_is_not_found_under_an_adapter() -> None:
    manager = BlockManager(16, 4)
    assert manager.allocate("base", len(TOKENS))
    manager.cache_full_blocks("base", TOKENS, len(TOKENS))
    assert manager.find_cached_prefix(TOKENS, len(TOKENS), chain_root(1)) == []
    assert len(manager.find_cached_prefix(TOKENS, len(TOKENS))) == 4


def test_the_engine_reuses_a_prompt_s_blocks_only_under_its_own_adapter(
    llama_dir: Path, llama_adapters: dict[str, Path]
) -> None:
    a, b = LoRARequest("a", 1, str(llama_adapters["a"])), LoRARequest("b", 2, str(llama_adapters["b"]))
    llm = LLM(str(llama_dir), backend="cpu", enable_lora=True, max_loras=2, max_model_len=64, block_size=4,
              kv_cache_memory=1 << 22)
    params = SamplingParams(temperature=0.0, max_tokens=2)

    def cached_tokens(lora: LoRARequest | None) -> int:
        [output] = llm.generate([{"prompt_token_ids": TOKENS + [3]}], params, use_tqdm=False, lora_request=lora)
        return output.num_cached_tokens

    try:
        assert cached_tokens(a) == 0
        assert cached_tokens(b) == 0
        assert cached_tokens(None) == 0
        assert cached_tokens(a) == 16 and cached_tokens(b) == 16 and cached_tokens(None) == 16
    finally:
        llm.llm_engine.shutdown()
