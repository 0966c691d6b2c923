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

import torch
from safetensors.torch import save

#: A file this instance wrote, and one it adopted from another instance (another name,
#: so a pending delete of one never meets a new link of the other).
WRITTEN, ADOPTED = ".safetensors", ".adopted.safetensors"
#: The safetensors metadata field that names the block a file holds.
KEY_FIELD = "key"


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


def adopt(ranks: list[tuple[Path, BlockLayout]], own: str, name: str) -> str | None:
    """Link block `name` from another instance's directory into `own` under every
    rank's root (`ranks`: each rank's root and block layout); returns the adopted file's path relative to the roots, or None (no
    instance holds a whole copy on every rank, or this instance has a name pending
    deletion in the way: a miss)."""
    target = f"{own}/{name}{ADOPTED}"
    first = ranks[0][0]
    for other in sorted(entry.name for entry in os.scandir(first) if entry.is_dir() and entry.name != own):
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
