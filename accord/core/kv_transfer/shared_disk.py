"""The disk tier's files as several instances share them through one `disk_path`:
each instance (each scheduler half) has its own directory under every rank's root,
`<disk_path>/rank<r>/<instance>/`, and deletes only the names in it. A block another
instance wrote is adopted before it is used: hard-linked into this instance's
directory (one atomic step that fails if the file is gone), so its writer deleting
its own name later never removes the data under a reader. A file is adopted only
if its safetensors header names the block and its size is the header's (a truncated
or foreign file is a miss, recomputed).

An instance marks each of its directories live with an flock on the directory's
`.live.lock`, held as long as the instance's scheduler half lives (the kernel drops
it when the process exits or is killed; over NFS Linux emulates flock with byte-range
locks). A directory whose mark no process holds belongs to a
stopped instance: a live one reclaims it, adopting its newest blocks into its own
directory while its own budget has room and deleting the directory. Its names are
the only ones deleted, so a block a live instance adopted from it (a link of its
own) survives, as when its writer evicts it."""

from __future__ import annotations

import fcntl
import json
import os
import struct
import uuid
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import IO

import torch
from safetensors.torch import save

#: A file this instance wrote, and one it adopted from another instance (another name,
#: so a pending delete of one never meets a new link of the other).
WRITTEN, ADOPTED = ".safetensors", ".adopted.safetensors"
#: The safetensors metadata field that names the block a file holds.
KEY_FIELD = "key"
#: The file in an instance directory whose flock marks its instance live, and the
#: prefix of a directory being made (ignored by the others until it is marked).
LIVENESS = ".live.lock"
_CLAIMING = ".claiming-"


def new_instance_dir() -> str:
    """A directory name no other instance uses."""
    return f"instance-{uuid.uuid4().hex[:12]}"


#: A block file's tensors as this instance's cache holds them: name -> (safetensors
#: dtype code, shape, bytes).
BlockLayout = dict[str, tuple[str, tuple[int, ...], int]]


def block_layout(tensors: dict[str, torch.Tensor]) -> BlockLayout:
    """The layout of a block file holding `tensors` (one block's, by file name); the
    dtype codes are those safetensors itself writes."""
    header = _header(save({name: torch.empty(0, dtype=tensor.dtype) for name, tensor in tensors.items()}))
    return {name: (header[name]["dtype"], tuple(tensor.shape), tensor.numel() * tensor.element_size())
            for name, tensor in tensors.items()}


def _header(data: bytes) -> dict:
    (length,) = struct.unpack("<Q", data[:8])
    return json.loads(data[8 : 8 + length])


def holds_block(path: Path, name: str, layout: BlockLayout) -> bool:
    """Whether `path` is a whole file of block `name` in `layout`: its header's key is
    `name`, its tensors have the layout's dtypes, shapes and sizes, and the file ends
    where the header's data does (a truncated or foreign file does not)."""
    try:
        with path.open("rb") as file:
            (length,) = struct.unpack("<Q", file.read(8))
            header = json.loads(file.read(length))
            size = os.fstat(file.fileno()).st_size
        if (header.pop("__metadata__", None) or {}).get(KEY_FIELD) != name or set(header) != set(layout):
            return False
        for tensor, (dtype, shape, nbytes) in layout.items():
            entry = header[tensor]
            start, end = entry["data_offsets"]
            if entry["dtype"] != dtype or tuple(entry["shape"]) != shape or end - start != nbytes:
                return False
        return size == 8 + length + max((entry["data_offsets"][1] for entry in header.values()), default=0)
    except (OSError, ValueError, KeyError, TypeError, AttributeError, struct.error):
        return False


def claim(roots: Sequence[Path], own: str) -> list[IO[bytes]]:
    """Make directory `own` under every root, each marked live: the returned files
    hold the marks' flocks, which last until they are closed (or this process ends).
    Each directory is made and marked under a name the others ignore, then renamed
    into place, so no instance ever sees it unmarked and takes it for a dead one's."""
    marks = []
    for root in roots:
        claiming = root / f"{_CLAIMING}{own}"
        claiming.mkdir(parents=True)
        mark = (claiming / LIVENESS).open("wb")
        fcntl.flock(mark, fcntl.LOCK_EX | fcntl.LOCK_NB)
        claiming.rename(root / own)
        marks.append(mark)
    return marks


def _instances(root: Path, own: str) -> list[str]:
    """The other instances' directories under `root`, by name."""
    try:
        entries = list(os.scandir(root))
    except FileNotFoundError:
        return []
    return sorted(entry.name for entry in entries
                  if entry.is_dir() and entry.name != own and not entry.name.startswith("."))


def _lock_if_dead(directory: Path) -> IO[bytes] | None:
    """`directory`'s liveness mark, locked by this process, if no other holds it (its
    instance stopped); None if its instance lives, if it has no mark (an instance of
    an accord before marks: left alone), or if another instance is reclaiming it."""
    try:
        mark = (directory / LIVENESS).open("rb")
    except OSError:
        return None
    try:
        fcntl.flock(mark, fcntl.LOCK_EX | fcntl.LOCK_NB)
        # Another reclaimer may have removed the mark between the open and the lock.
        if os.fstat(mark.fileno()).st_nlink:
            return mark
    except OSError:
        pass
    mark.close()
    return None


def _block_names(directory: Path) -> list[str]:
    """The blocks `directory` holds files of (once each), newest file first."""
    found = []
    for entry in os.scandir(directory):
        for suffix in (ADOPTED, WRITTEN):
            name = entry.name.removesuffix(suffix)
            if name != entry.name:
                break
        else:
            continue
        try:
            bytes.fromhex(name)
            found.append((entry.stat().st_mtime_ns, name))
        except (ValueError, OSError):
            continue
    return list(dict.fromkeys(name for _, name in sorted(found, reverse=True)))


def _remove(directory: Path) -> None:
    """Delete `directory`: its files, its liveness mark last (while it exists no
    other instance starts reclaiming it), then the directory."""
    try:
        entries = [entry.name for entry in os.scandir(directory)]
    except FileNotFoundError:
        return
    for name in sorted(entries, key=lambda name: name == LIVENESS):
        (directory / name).unlink(missing_ok=True)
    try:
        directory.rmdir()
    except OSError:
        pass  # a file appeared (written by hand?): left for the next reclaim


def reclaim(
    ranks: list[tuple[Path, BlockLayout]], own: str, held: Callable[[str], bool], room: int
) -> tuple[list[tuple[str, str]], int]:
    """Reclaim the directories of stopped instances under every rank's root (`ranks`:
    each rank's root and block layout): adopt their newest whole blocks that `held`
    (this instance has them) does not name, at most `room`, then delete the
    directories. Returns the adopted blocks as (name, path relative to the roots),
    each directory's newest first, and how many directories were reclaimed."""
    adopted: list[tuple[str, str]] = []
    reclaimed = 0
    for other in sorted({name for root, _ in ranks for name in _instances(root, own)}):
        present = [root / other for root, _ in ranks if (root / other).is_dir()]
        marks = []
        for directory in present:
            mark = _lock_if_dead(directory)
            if mark is None:
                break
            marks.append(mark)
        if len(marks) == len(present):
            for name in _block_names(present[0]) if len(present) == len(ranks) else []:
                if len(adopted) >= room:
                    break
                path = None if held(name) else _link(ranks, other, own, name)
                if path is not None:
                    adopted.append((name, path))
            for directory in present:
                _remove(directory)
            reclaimed += 1
        for mark in marks:
            mark.close()
    return adopted, reclaimed


def _link(ranks: list[tuple[Path, BlockLayout]], other: str, own: str, name: str) -> str | None:
    """Link block `name` from instance `other`'s directory into `own` under every
    rank's root; its path relative to the roots, or None (no whole copy on every
    rank, or a name of `own` in the way)."""
    target = f"{own}/{name}{ADOPTED}"
    for suffix in (WRITTEN, ADOPTED):
        linked = []
        for root, layout in ranks:
            try:
                os.link(root / other / f"{name}{suffix}", root / target)
            except OSError:
                break
            linked.append(root / target)
            if not holds_block(root / target, name, layout):
                break
        else:
            return target
        for path in linked:  # only this instance knew these links
            path.unlink(missing_ok=True)
    return None


def adopt(ranks: list[tuple[Path, BlockLayout]], own: str, name: str) -> str | None:
    """Link block `name` from another instance's directory into `own` under every
    rank's root (`ranks`: each rank's root and block layout); returns the adopted
    file's path relative to the roots, or None (no instance holds a whole copy on
    every rank, or this instance has a name pending deletion in the way: a miss)."""
    for other in _instances(ranks[0][0], own):
        path = _link(ranks, other, own, name)
        if path is not None:
            return path
    return None
