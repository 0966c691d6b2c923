"""The shared disk tier's liveness marks across ranks (shared_disk.py), with a real
owner process: while the process that claimed an instance directory on two ranks
lives, reclaiming leaves both alone; once it is gone, both are removed and their
whole blocks adopted into the reclaimer's directory, within its room; a stopped
instance's directory missing on one rank is removed without adopting from it."""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
import torch
from safetensors.torch import save_file

from accord.core.kv_transfer.shared_disk import ADOPTED, KEY_FIELD, WRITTEN, block_layout, claim, reclaim

BLOCK = {"0.0": torch.arange(8, dtype=torch.float32)}
NAMES = [f"{index:02x}" * 32 for index in range(3)]

#: The owner: claims `instance` on every root given, writes each block file, says so,
#: then waits for stdin to close (a clean exit) unless killed first.
OWNER = """
import sys
from pathlib import Path
import torch
from safetensors.torch import save_file
from accord.core.kv_transfer.shared_disk import claim
roots, names = [Path(root) for root in sys.argv[1].split(",")], sys.argv[2].split(",")
marks = claim(roots, "instance-owner")
for root in roots:
    for name in names:
        save_file({"0.0": torch.arange(8, dtype=torch.float32)}, str(root / "instance-owner" / f"{name}.safetensors"),
                  metadata={"key": name})
print("ready", flush=True)
sys.stdin.read()
"""


@pytest.fixture
def roots(tmp_path: Path) -> list[Path]:
    return [tmp_path / "rank0", tmp_path / "rank1"]


@pytest.fixture
def owner(roots: list[Path]) -> Iterator[subprocess.Popen]:
    """The owner process of `instance-owner` on both ranks, started and ready."""
    process = subprocess.Popen([sys.executable, "-c", OWNER, ",".join(map(str, roots)), ",".join(NAMES)],
                               stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    assert process.stdout.readline() == "ready\n"
    yield process
    process.kill()
    process.wait()


def _ranks(roots: list[Path]) -> list:
    return [(root, block_layout(BLOCK)) for root in roots]


def test_a_live_owners_directories_are_never_reclaimed(roots: list[Path], owner: subprocess.Popen) -> None:
    claim(roots, "instance-me")
    assert reclaim(_ranks(roots), "instance-me", lambda name: False, room=8) == ([], 0)
    for root in roots:
        assert sorted(path.name for path in (root / "instance-owner").glob("*" + WRITTEN)) == [
            f"{name}{WRITTEN}" for name in NAMES]


@pytest.mark.parametrize("ends", ["killed", "exits"])
def test_a_gone_owners_directories_are_removed_on_every_rank_their_blocks_adopted_within_room(
    roots: list[Path], owner: subprocess.Popen, ends: str
) -> None:
    if ends == "killed":
        owner.kill()
    else:
        owner.stdin.close()
    owner.wait()
    claim(roots, "instance-me")
    # This instance holds the newest block already, and has room for one more.
    adopted, reclaimed = reclaim(_ranks(roots), "instance-me", lambda name: name == NAMES[-1], room=1)
    assert reclaimed == 1 and len(adopted) == 1
    name, path = adopted[0]
    assert name in NAMES[:-1] and path == f"instance-me/{name}{ADOPTED}"
    for root in roots:
        assert not (root / "instance-owner").exists()
        assert (root / path).exists()


def test_a_stopped_instance_missing_on_one_rank_is_removed_without_adopting(roots: list[Path]) -> None:
    # As a crash between claiming rank 0 and rank 1 leaves it: a marked directory,
    # its mark unheld, on rank 0 only.
    marks = claim(roots[:1], "instance-half")
    save_file(BLOCK, str(roots[0] / "instance-half" / f"{NAMES[0]}{WRITTEN}"), metadata={KEY_FIELD: NAMES[0]})
    marks[0].close()
    roots[1].mkdir()
    claim(roots, "instance-me")
    assert reclaim(_ranks(roots), "instance-me", lambda name: False, room=8) == ([], 1)
    assert not (roots[0] / "instance-half").exists()
