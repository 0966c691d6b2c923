"""Process helpers for the executor tests (a uniquely named module)."""

from __future__ import annotations

import os
import signal
import threading
import time
from pathlib import Path
from typing import Any

import pytest

from accord import SamplingParams
from accord.core.errors import EngineDeadError


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


def assert_killing_a_worker_fails_the_engine(engine: Any, rank: int, timeout: float) -> None:
    """Start three long requests on `engine`, run one step, SIGKILL rank `rank`'s worker,
    then step (in a thread): within `timeout` seconds a step must raise EngineDeadError
    naming the rank, and every later step must raise it too."""
    for index in range(3):
        engine.add_request(f"r{index}", {"prompt_token_ids": [1, 2, 3 + index]}, SamplingParams(max_tokens=100))
    engine.step()
    os.kill(engine.executor.worker_pids[rank], signal.SIGKILL)
    raised: list[BaseException] = []

    def step_until_it_raises() -> None:
        try:
            for _ in range(200):
                engine.step()
        except BaseException as error:  # noqa: BLE001 - handed to the test
            raised.append(error)

    stepper = threading.Thread(target=step_until_it_raises, daemon=True)
    stepper.start()
    stepper.join(timeout=timeout)
    assert not stepper.is_alive(), "a step hung after a worker died"
    assert len(raised) == 1 and isinstance(raised[0], EngineDeadError), raised
    assert f"worker rank {rank} died" in str(raised[0])
    with pytest.raises(EngineDeadError):
        engine.step()
