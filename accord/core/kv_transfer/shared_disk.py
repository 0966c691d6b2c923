"""The disk tier's files as several instances share them through one `disk_path`:
each instance (each scheduler half) has its own directory under every rank's root,
`<disk_path>/rank<r>/<instance>/`, and deletes only the names in it. A block another
instance wrote is adopted before it is used: hard-linked into this instance's
directory (one atomic step that fails if the file is gone), so its writer deleting
its own name later never removes the data under a reader. A file is adopted only
if its safetensors header names the block and its size is the header's (a truncated
or foreign file is a miss, recomputed)."""

from __future__ import annotations

import json
import os
import struct
import uuid
from pathlib import Path

#: A file this instance wrote, and one it adopted from another instance (another name,
#: so a pending delete of one never meets a new link of the other).
WRITTEN, ADOPTED = ".safetensors", ".adopted.safetensors"
#: The safetensors metadata field that names the block a file holds.
KEY_FIELD = "key"


def new_instance_dir() -> str:
    """A directory name no other instance uses."""
    return f"instance-{uuid.uuid4().hex[:12]}"


def block_bytes_on_file(path: Path, name: str) -> int | None:
    """The tensor bytes of the block file `path` if it is whole and holds block `name`
    (its header's key, and its size that of its header and data), else None."""
    try:
        with path.open("rb") as file:
            (length,) = struct.unpack("<Q", file.read(8))
            header = json.loads(file.read(length))
            size = os.fstat(file.fileno()).st_size
    except (OSError, ValueError, struct.error):
        return None
    if not isinstance(header, dict) or (header.get("__metadata__") or {}).get(KEY_FIELD) != name:
        return None
    tensors = [entry for field, entry in header.items() if field != "__metadata__"]
    end = max((entry["data_offsets"][1] for entry in tensors), default=0)
    return end if size == 8 + length + end else None


def adopt(ranks: list[tuple[Path, int]], own: str, name: str) -> str | None:
    """Link block `name` from another instance's directory into `own` under every
    rank's root (`ranks`: each rank's root and block bytes); returns the adopted file's path relative to the roots, or None (no
    instance holds a whole copy on every rank, or this instance has a name pending
    deletion in the way: a miss)."""
    target = f"{own}/{name}{ADOPTED}"
    first = ranks[0][0]
    for other in sorted(entry.name for entry in os.scandir(first) if entry.is_dir() and entry.name != own):
        for suffix in (WRITTEN, ADOPTED):
            linked = []
            for root, rank_bytes in ranks:
                try:
                    os.link(root / other / f"{name}{suffix}", root / target)
                except OSError:
                    break
                linked.append(root / target)
                if block_bytes_on_file(root / target, name) != rank_bytes:
                    break
            else:
                return target
            for path in linked:  # only this instance knew these links
                path.unlink(missing_ok=True)
    return None
