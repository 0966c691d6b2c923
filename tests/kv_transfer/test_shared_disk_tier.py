"""A disk KV tier shared by two instances through one `disk_path`
(OffloadingConnector, shared_disk.py): a prefix one engine computed and demoted to
disk is served to another engine from the first one's files, with the greedy tokens
of an engine with no tier and no prompt token recomputed; a file gone before the
lookup, truncated, holding another block or in another layout, is recomputed with the same tokens;
a file adopted at lookup survives its writer deleting it before the load. The
directory of an instance whose process stopped or was killed is reclaimed (its newest
blocks adopted within the reclaimer's budget, the rest deleted); a live one's never is.
Two engine processes share one tier as two engines of one process do."""

from __future__ import annotations

import random
import shutil
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from safetensors import safe_open
from safetensors.torch import save_file

from accord import LLM
from accord.core.kv_transfer import offload
from accord.core.sampling_params import SamplingParams
from shared_disk_process import TierProcess  # (this directory is on sys.path)

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


def _tiers(disk: Path, cpu_blocks: int = 8, disk_blocks: int = 64, **extra: object) -> dict:
    return {"kv_connector": "OffloadingConnector", "kv_role": "kv_both", "kv_connector_extra_config": {
        "cpu_bytes_to_use": cpu_blocks * BLOCK_BYTES, "disk_path": str(disk),
        "disk_bytes_to_use": disk_blocks * BLOCK_BYTES, **extra}}


def _tiered(llama_dir: Path, disk: Path, cpu_blocks: int = 8, disk_blocks: int = 64, **extra: object) -> LLM:
    return LLM(str(llama_dir), kv_transfer_config=_tiers(disk, cpu_blocks, disk_blocks, **extra), **ENGINE_ARGS)


def _tokens(llm: LLM, prompt: dict) -> list[int]:
    return llm.generate([prompt], GREEDY)[0].outputs[0].token_ids


def _files_of_a(llama_dir: Path, disk: Path, first: dict, others: list[dict]) -> tuple[LLM, list[Path]]:
    """Engine A computes `first`, then `others` push its blocks out of A's device pool
    and 8-block CPU tier onto disk: A (live while the caller holds it, so its directory
    is not reclaimed as a stopped instance's) and the files of `first`'s six full
    blocks, in order."""
    a = _tiered(llama_dir, disk)
    _tokens(a, first)
    for prompt in others:
        _tokens(a, prompt)
    manager = a.llm_engine.scheduler.block_manager
    chain = manager.chain_keys(first["prompt_token_ids"], 6 * BLOCK)
    own = disk / "rank0" / a.llm_engine.scheduler.kv_connector.instance_dir
    files = [own / f"{key.hex()}.safetensors" for key in chain]
    assert all(file.exists() for file in files)
    return a, files


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
    a, _ = _files_of_a(llama_dir, tmp_path, first, others)
    tokens, computed, adopted = _serve_on_b(llama_dir, tmp_path, first)
    assert tokens == expected
    # All six full blocks came from A's files: only the last prompt token was computed.
    assert (computed, adopted) == (1, 6)


def test_a_file_its_writer_deletes_after_the_lookup_is_still_loaded(
    llama_dir: Path, tmp_path: Path, expected: list[int], monkeypatch: pytest.MonkeyPatch
) -> None:
    first, *others = _prompts(5)
    a, files = _files_of_a(llama_dir, tmp_path, first, others)
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
    a, files = _files_of_a(llama_dir, tmp_path, first, others)
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
    a, _ = _files_of_a(llama_dir, tmp_path, first, others)
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


@pytest.fixture
def tier_process(llama_dir: Path, tmp_path: Path) -> Iterator[Callable[..., TierProcess]]:
    """Starts tiered engines on `tmp_path` in processes of their own; stops them after."""
    started: list[TierProcess] = []

    def start(**tiers: object) -> TierProcess:
        started.append(TierProcess(str(llama_dir), ENGINE_ARGS, _tiers(tmp_path, **tiers)))
        return started[-1]

    yield start
    for process in started:
        process.stop()


def _run_a(start: Callable[..., TierProcess], prompts: list[dict]) -> tuple[TierProcess, list[list[int]]]:
    """Process A serves `prompts` one by one (the later ones push the earlier ones'
    blocks onto disk): A and the tokens it gave."""
    a = start()
    return a, [a.call("generate", prompt, GREEDY.max_tokens) for prompt in prompts]


def _block_files(directory: Path) -> dict[str, int]:
    """The blocks `directory` holds files of, by block name, with the files' mtimes."""
    return {file.name.split(".")[0]: file.stat().st_mtime_ns for file in directory.glob("*.safetensors")}


def test_a_killed_instances_directory_is_reclaimed_and_its_blocks_serve_the_next_instance(
    llama_dir: Path, tmp_path: Path, expected: list[int], tier_process: Callable[..., TierProcess]
) -> None:
    first, *others = _prompts(5)
    a, _ = _run_a(tier_process, [first, *others])
    a_dir = tmp_path / "rank0" / a.instance_dir
    a_blocks = _block_files(a_dir)
    assert len(a_blocks) > 6
    # A directory with no liveness mark (an older accord's) is not known dead: kept.
    unmarked = tmp_path / "rank0" / "instance-unmarked"
    unmarked.mkdir()
    (unmarked / "block.safetensors").write_bytes(b"x")
    a.kill()
    b = _tiered(llama_dir, tmp_path)
    tier = b.llm_engine.scheduler.kv_connector
    # At B's start-up: A's directory is gone, every block of it now in B's own.
    assert not a_dir.exists() and (unmarked / "block.safetensors").exists()
    assert _block_files(tmp_path / "rank0" / tier.instance_dir).keys() == a_blocks.keys()
    assert (tier.instances_reclaimed, tier.blocks_reclaimed) == (1, len(a_blocks))
    assert _tokens(b, first) == expected
    # The six full blocks read from B's own directory (no lookup in another's).
    assert b.llm_engine.stats.computed_prompt_tokens == 1
    assert (tier.blocks_loaded_from_disk, tier.blocks_adopted) == (6, 0)


def test_a_stopped_instances_newest_blocks_are_kept_within_the_budget_and_the_rest_deleted(
    llama_dir: Path, tmp_path: Path, tier_process: Callable[..., TierProcess]
) -> None:
    a, _ = _run_a(tier_process, _prompts(5))
    a_dir = tmp_path / "rank0" / a.instance_dir
    a_blocks = _block_files(a_dir)
    a.stop()  # a clean exit this time
    b = _tiered(llama_dir, tmp_path, disk_blocks=4)
    tier = b.llm_engine.scheduler.kv_connector
    kept = _block_files(tmp_path / "rank0" / tier.instance_dir)
    assert not a_dir.exists()
    assert len(kept) == 4 and kept.keys() <= a_blocks.keys()
    # The newest four of A's files (ties in mtime allowed).
    assert min(a_blocks[name] for name in kept) >= max(a_blocks[name] for name in a_blocks.keys() - kept.keys())
    assert (tier.instances_reclaimed, tier.blocks_reclaimed) == (1, 4)


def test_a_live_instances_directory_is_never_reclaimed_until_its_process_is_killed(
    llama_dir: Path, tmp_path: Path, tier_process: Callable[..., TierProcess]
) -> None:
    prompts = _prompts(5)
    a, wanted = _run_a(tier_process, prompts)
    a_dir = tmp_path / "rank0" / a.instance_dir
    a_blocks = _block_files(a_dir)
    # B looks for stopped instances every step, adopts A's blocks at lookup and evicts
    # its own through a 4-block CPU tier and a 4-block disk.
    b = _tiered(llama_dir, tmp_path, cpu_blocks=4, disk_blocks=4, disk_reclaim_interval_s=0)
    tier = b.llm_engine.scheduler.kv_connector
    assert [_tokens(b, prompt) for prompt in prompts] == wanted
    assert tier.blocks_adopted > 0 and tier.instances_reclaimed == 0
    assert _block_files(a_dir) == a_blocks  # every file of A's, untouched
    a.kill()
    assert _tokens(b, prompts[0]) == wanted[0]
    assert not a_dir.exists() and tier.instances_reclaimed == 1


def test_a_prefix_one_engine_process_computed_is_served_by_another_process_from_the_shared_disk(
    tmp_path: Path, expected: list[int], tier_process: Callable[..., TierProcess]
) -> None:
    first, *others = _prompts(5)
    a, tokens_of_a = _run_a(tier_process, [first, *others])
    assert tokens_of_a[0] == expected
    b = tier_process()
    before = b.call("counters")
    assert b.call("generate", first, GREEDY.max_tokens) == expected
    after = b.call("counters")
    # Process B read the six full blocks from A's files (adopted at lookup, A being
    # live): only the last prompt token was computed, the one whose logits sample.
    assert after["computed_prompt_tokens"] - before["computed_prompt_tokens"] == 1
    assert after["blocks_adopted"] == after["blocks_loaded_from_disk"] == 6
    # No block leaks on either side: both device pools are whole again.
    for counters in (after, a.call("counters")):
        assert counters["free_blocks"] == counters["num_blocks"]
