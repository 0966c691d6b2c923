"""Process helpers for the executor tests (a uniquely named module)."""

from __future__ import annotations

import os
import time
from pathlib import Path


def is_running(pid: int) -> bool:
    """Whether `pid` is a live process (a zombie waiting to be reaped is not)."""
    stat = Path(f"/proc/{pid}/stat")
    try:
        # The state follows the parenthesised command name, which may hold spaces.
        return stat.read_text().rpartition(")")[2].split()[0] not in ("Z", "X")
    except (FileNotFoundError, ProcessLookupError, IndexError):
        return False
    except OSError:
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return False
        return True


def wait_until_gone(pids: list[int], timeout: float = 30.0) -> list[int]:
    """Wait for the processes to end; returns those still running at the timeout."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        alive = [pid for pid in pids if is_running(pid)]
        if not alive:
            return []
        time.sleep(0.1)
    return [pid for pid in pids if is_running(pid)]


def child_pids(pid: int) -> list[int]:
    """Direct children of `pid` (from /proc)."""
    children = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            fields = (entry / "stat").read_text().rpartition(")")[2].split()
        except OSError:
            continue
        if int(fields[1]) == pid and fields[0] not in ("Z", "X"):
            children.append(int(entry.name))
    return children
