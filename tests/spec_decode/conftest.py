"""Fixtures for the speculative decoding tests: a tiny random Llama whose next token is
mostly its current token plus one (a counting model, so drafts taken from a counting
prompt are often right and sometimes wrong), built once per session with transformers;
and engines over it, each checked after every test to hold no KV block."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest
import torch

_ENGINE_HELPERS = str(Path(__file__).resolve().parent.parent / "engine")
if _ENGINE_HELPERS not in sys.path:
    sys.path.insert(0, _ENGINE_HELPERS)

from engine_models import MAX_POSITIONS, write_tokenizer  # noqa: E402

#: How much the layers add to the residual stream: small enough that the embedding
#: mostly decides the next token (count on), large enough that it sometimes does not.
LAYER_SCALE = 0.04


@pytest.fixture(scope="session")
def counting_llama_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    from transformers import LlamaConfig, LlamaForCausalLM

    directory = tmp_path_factory.mktemp("models") / "counting_llama"
    directory.mkdir()
    vocab_size, bos_id, eos_id = write_tokenizer(directory)
    config = LlamaConfig(
        vocab_size=vocab_size, hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
        num_key_value_heads=2, max_position_embeddings=MAX_POSITIONS, bos_token_id=bos_id, eos_token_id=eos_id,
        initializer_range=0.2, tie_word_embeddings=False,
    )
    torch.manual_seed(0)
    model = LlamaForCausalLM(config).float().eval()
    with torch.no_grad():
        embed = model.model.embed_tokens.weight
        # Row v of the head is token v-1's embedding: the head's best answer to token t is t + 1.
        model.lm_head.weight.copy_(torch.roll(embed, shifts=1, dims=0))
        for layer in model.model.layers:
            layer.self_attn.o_proj.weight.mul_(LAYER_SCALE)
            layer.mlp.down_proj.weight.mul_(LAYER_SCALE)
    model.save_pretrained(directory)
    return directory


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


@pytest.fixture(autouse=True, scope="module")
def one_torch_thread():
    """Tiny models run fastest single-threaded on a shared machine."""
    previous = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(previous)


@pytest.fixture(autouse=True)
def every_block_is_freed_after_the_test():
    """After every test the free-block count of every engine is back to the total,
    rejected drafts' blocks included."""
    yield
    for llm in _ENGINES.values():
        manager = llm.llm_engine.scheduler.block_manager
        assert manager.num_free_blocks == manager.num_blocks, f"{manager.num_used_blocks} KV blocks leaked"
