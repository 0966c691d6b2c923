"""The local-disk KV tier under the CPU tier (OffloadingConnector's
kv_connector_extra_config disk_path / disk_bytes_to_use): a prefix evicted from the
device pool and then from the CPU tier is read back from disk, not recomputed, with
the greedy tokens of an engine that never evicted it; its files are named by the
prefix's SHA-256 block chain, the same on every instance."""

from __future__ import annotations

import hashlib
import random
from array import array
from pathlib import Path

from accord import LLM
from accord.core.sampling_params import SamplingParams

BLOCK = 16
#: A device pool of 16 blocks: a 97-token prompt and its output take 7.
ENGINE_ARGS = dict(backend="cpu", max_model_len=128, num_gpu_blocks_override=16, max_num_batched_tokens=128,
                   block_size=BLOCK, max_num_seqs=1)
GREEDY = SamplingParams(temperature=0.0, max_tokens=4, ignore_eos=True)
#: The tiny Llama's KV block over all layers (the first test checks it).
BLOCK_BYTES = 8 << 10


def _prompts(count: int, length: int) -> list[dict]:
    rng = random.Random(1)
    return [{"prompt_token_ids": [rng.randrange(3, 200) for _ in range(length)]} for _ in range(count)]


def _tokens(llm: LLM, prompt: dict) -> list[int]:
    return llm.generate([prompt], GREEDY)[0].outputs[0].token_ids


def _chain(token_ids: list[int], blocks: int) -> list[str]:
    """The SHA-256 chain of a prompt's full blocks, computed here from its definition
    (parent digest, then the block's token ids as int64), in hex."""
    parent, names = b"", []
    for block in range(blocks):
        parent = hashlib.sha256(parent + array("q", token_ids[block * BLOCK : (block + 1) * BLOCK]).tobytes()).digest()
        names.append(parent.hex())
    return names


def test_a_prefix_evicted_from_device_and_cpu_tiers_is_served_from_disk_with_nothing_recomputed(
    llama_dir: Path, tmp_path: Path
) -> None:
    tiers = {"kv_connector": "OffloadingConnector", "kv_role": "kv_both", "kv_connector_extra_config": {
        "cpu_bytes_to_use": 8 * BLOCK_BYTES, "disk_path": str(tmp_path), "disk_bytes_to_use": 64 * BLOCK_BYTES}}
    llm = LLM(str(llama_dir), kv_transfer_config=tiers, **ENGINE_ARGS)
    engine = llm.llm_engine
    manager, tier = engine.scheduler.block_manager, engine.scheduler.kv_connector
    assert tier.bytes_per_block == BLOCK_BYTES
    first, *others = _prompts(5, 6 * BLOCK + 1)
    expected = _tokens(LLM(str(llama_dir), **ENGINE_ARGS), first)
    assert _tokens(llm, first) == expected
    for prompt in others:  # 24 more blocks: out of the device pool, and out of the 8-block CPU tier
        _tokens(llm, prompt)
    names = _chain(first["prompt_token_ids"], 6)
    assert manager.find_cached_prefix(first["prompt_token_ids"], 6 * BLOCK) == []
    assert {path.name.removesuffix(".safetensors") for path in (tmp_path / "rank0").glob("*/*")} >= set(names)
    computed, from_disk = engine.stats.computed_prompt_tokens, tier.blocks_loaded_from_disk
    again = llm.generate([first], GREEDY)[0]
    assert again.outputs[0].token_ids == expected
    # All six full blocks were read from disk: only the last prompt token was computed.
    assert engine.stats.computed_prompt_tokens - computed == 1
    assert tier.blocks_loaded_from_disk - from_disk == 6
    assert manager.num_free_blocks == manager.num_blocks


def test_the_disk_tier_keeps_its_size_deleting_least_recently_used_files(llama_dir: Path, tmp_path: Path) -> None:
    tiers = {"kv_connector": "OffloadingConnector", "kv_role": "kv_both", "kv_connector_extra_config": {
        "cpu_bytes_to_use": 4 * BLOCK_BYTES, "disk_path": str(tmp_path), "disk_bytes_to_use": 10 * BLOCK_BYTES}}
    llm = LLM(str(llama_dir), kv_transfer_config=tiers, **ENGINE_ARGS)
    prompts = _prompts(6, 6 * BLOCK + 1)
    plain = LLM(str(llama_dir), **ENGINE_ARGS)
    expected = [_tokens(plain, prompt) for prompt in prompts]
    # 36 blocks through a 4-block CPU tier and a 10-block disk, twice: files are
    # deleted and rewritten while prefixes come back, and every answer stays right.
    order = prompts + prompts[::-1]
    assert [_tokens(llm, prompt) for prompt in order] == expected + expected[::-1]
    tier = llm.llm_engine.scheduler.kv_connector
    assert len(list((tmp_path / "rank0").glob("*/*.safetensors"))) == 10
    assert tier.blocks_demoted > 10  # so files were deleted to stay at 10
