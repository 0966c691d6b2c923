"""A disk KV tier shared by two instances through one `disk_path`
(OffloadingConnector, shared_disk.py): a prefix one engine computed and demoted to
disk is served to another engine from the first one's files, with the greedy tokens
of an engine with no tier and no prompt token recomputed; a file gone before the
lookup, truncated, holding another block or in another layout, is recomputed with the same tokens;
a file adopted at lookup survives its writer deleting it before the load."""

from __future__ import annotations

import random
import shutil
from pathlib import Path

import pytest

from safetensors import safe_open
from safetensors.torch import save_file

from accord import LLM
from accord.core.kv_transfer import offload
from accord.core.sampling_params import SamplingParams

BLOCK = 16
#: A device pool of 16 blocks: a 97-token prompt (six full blocks) and its output take 7.
ENGINE_ARGS = dict(backend="cpu", max_model_len=128, num_gpu_blocks_override=16, max_num_batched_tokens=128,
                   block_size=BLOCK, max_num_seqs=1)
GREEDY = SamplingParams(temperature=0.0, max_tokens=4, ignore_eos=True)
#: The tiny Llama's KV block over all layers (test_disk_tier.py checks it).
BLOCK_BYTES = 8 << 10


def _prompts(count: int) -> list[dict]:
    rng = random.Random(2)
    return [{"prompt_token_ids": [rng.randrange(3, 200) for _ in range(6 * BLOCK + 1)]} for _ in range(count)]


def _tiered(llama_dir: Path, disk: Path, cpu_blocks: int = 8, disk_blocks: int = 64) -> LLM:
    tiers = {"kv_connector": "OffloadingConnector", "kv_role": "kv_both", "kv_connector_extra_config": {
        "cpu_bytes_to_use": cpu_blocks * BLOCK_BYTES, "disk_path": str(disk),
        "disk_bytes_to_use": disk_blocks * BLOCK_BYTES}}
    return LLM(str(llama_dir), kv_transfer_config=tiers, **ENGINE_ARGS)


def _tokens(llm: LLM, prompt: dict) -> list[int]:
    return llm.generate([prompt], GREEDY)[0].outputs[0].token_ids


def _files_of_a(llama_dir: Path, disk: Path, first: dict, others: list[dict]) -> list[Path]:
    """Engine A computes `first`, then `others` push its blocks out of A's device pool
    and 8-block CPU tier onto disk; the files of `first`'s six full blocks, in order."""
    a = _tiered(llama_dir, disk)
    _tokens(a, first)
    for prompt in others:
        _tokens(a, prompt)
    manager = a.llm_engine.scheduler.block_manager
    chain = manager.chain_keys(first["prompt_token_ids"], 6 * BLOCK)
    own = disk / "rank0" / a.llm_engine.scheduler.kv_connector.instance_dir
    files = [own / f"{key.hex()}.safetensors" for key in chain]
    assert all(file.exists() for file in files)
    return files


def _serve_on_b(llama_dir: Path, disk: Path, prompt: dict, disk_blocks: int = 64) -> tuple[list[int], int, int]:
    """Engine B (a fresh instance on the same disk_path) serves `prompt`: its tokens,
    the prompt tokens it computed and the blocks it took from A's directory; its
    whole device pool is free after."""
    b = _tiered(llama_dir, disk, disk_blocks=disk_blocks)
    engine = b.llm_engine
    tokens = _tokens(b, prompt)
    manager = engine.scheduler.block_manager
    assert manager.num_free_blocks == manager.num_blocks
    return tokens, engine.stats.computed_prompt_tokens, engine.scheduler.kv_connector.blocks_adopted


@pytest.fixture(scope="module")
def expected(llama_dir: Path) -> list[int]:
    """The greedy tokens of the first prompt on an engine with no tier."""
    return _tokens(LLM(str(llama_dir), **ENGINE_ARGS), _prompts(1)[0])


def test_a_prefix_one_instance_computed_is_served_to_another_from_the_shared_disk(
    llama_dir: Path, tmp_path: Path, expected: list[int]
) -> None:
    first, *others = _prompts(5)
    _files_of_a(llama_dir, tmp_path, first, others)
    tokens, computed, adopted = _serve_on_b(llama_dir, tmp_path, first)
    assert tokens == expected
    # All six full blocks came from A's files: only the last prompt token was computed.
    assert (computed, adopted) == (1, 6)


def test_a_file_its_writer_deletes_after_the_lookup_is_still_loaded(
    llama_dir: Path, tmp_path: Path, expected: list[int], monkeypatch: pytest.MonkeyPatch
) -> None:
    first, *others = _prompts(5)
    files = _files_of_a(llama_dir, tmp_path, first, others)
    adopt = offload.adopt

    def adopt_then_writer_deletes(ranks, own, name):
        path = adopt(ranks, own, name)
        # As A's LRU would: A drops its name between B's lookup and B's load.
        (ranks[0][0] / next(file.parent.name for file in files) / f"{name}.safetensors").unlink()
        return path

    monkeypatch.setattr(offload, "adopt", adopt_then_writer_deletes)
    tokens, computed, adopted = _serve_on_b(llama_dir, tmp_path, first)
    assert not any(file.exists() for file in files)
    assert tokens == expected
    assert (computed, adopted) == (1, 6)


@pytest.mark.parametrize("damage", ["deleted", "truncated", "another block's file", "another layout"])
def test_a_missing_or_damaged_file_is_recomputed_with_the_same_tokens(
    llama_dir: Path, tmp_path: Path, expected: list[int], damage: str
) -> None:
    first, *others = _prompts(5)
    files = _files_of_a(llama_dir, tmp_path, first, others)
    broken = files[3]
    if damage == "deleted":
        broken.unlink()
    elif damage == "truncated":
        broken.write_bytes(broken.read_bytes()[:-100])
    elif damage == "another block's file":
        shutil.copyfile(files[0], broken)
    else:  # the same block and bytes, as a cache of another shape would write them
        with safe_open(str(broken), "pt") as file:
            metadata = file.metadata()
            tensors = {name: file.get_tensor(name).flatten() for name in file.keys()}
        save_file(tensors, str(broken), metadata=metadata)
    tokens, computed, adopted = _serve_on_b(llama_dir, tmp_path, first)
    assert tokens == expected
    # Blocks 0-2 came from A's files; from block 3 on the prompt is recomputed.
    assert (computed, adopted) == (3 * BLOCK + 1, 3)


def test_an_instance_adopts_no_more_than_its_own_disk_holds(llama_dir: Path, tmp_path: Path, expected: list[int]) -> None:
    first, *others = _prompts(5)
    _files_of_a(llama_dir, tmp_path, first, others)
    # B's disk holds 4 blocks: it adopts the first four (deleting none of them to make
    # room for the next) and computes the rest.
    tokens, computed, adopted = _serve_on_b(llama_dir, tmp_path, first, disk_blocks=4)
    assert tokens == expected
    assert (computed, adopted) == (2 * BLOCK + 1, 4)


def test_two_instances_evicting_and_adopting_on_one_small_disk_keep_every_answer(
    llama_dir: Path, tmp_path: Path
) -> None:
    prompts = _prompts(6)
    plain = LLM(str(llama_dir), **ENGINE_ARGS)
    wanted = [_tokens(plain, prompt) for prompt in prompts]
    # 36 blocks through two 4-block CPU tiers and two 10-block disk directories: each
    # instance deletes its own files while the other adopts them, in turns.
    engines = [_tiered(llama_dir, tmp_path, cpu_blocks=4, disk_blocks=10) for _ in range(2)]
    order = list(range(6)) + list(range(5, -1, -1)) + list(range(0, 6, 2))
    got = [_tokens(engines[turn % 2], prompts[index]) for turn, index in enumerate(order)]
    assert got == [wanted[index] for index in order]
    tiers = [engine.llm_engine.scheduler.kv_connector for engine in engines]
    assert all(tier.blocks_adopted > 0 and tier.blocks_demoted > 10 for tier in tiers)
    for engine in engines:
        manager = engine.llm_engine.scheduler.block_manager
        assert manager.num_free_blocks == manager.num_blocks
    for tier in tiers:
        assert len(list((tmp_path / "rank0" / tier.instance_dir).glob("*.safetensors"))) <= 10
