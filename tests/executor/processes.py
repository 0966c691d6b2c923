"""Process helpers for the executor tests (a uniquely named module)."""

from __future__ import annotations

import os
import signal
import threading
import time
from pathlib import Path
from typing import Any

from accord import SamplingParams


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


def errors_after_killing_a_worker(engine: Any, pid: int, timeout: float) -> list[BaseException] | None:
    """Start three long requests on `engine`, run one step, SIGKILL worker `pid`, then step
    (in a thread) until a step raises. Returns what the steps raised, or None when they
    were still running after `timeout` seconds (a hang)."""
    for index in range(3):
        engine.add_request(f"r{index}", {"prompt_token_ids": [1, 2, 3 + index]}, SamplingParams(max_tokens=100))
    engine.step()
    os.kill(pid, signal.SIGKILL)
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
    return None if stepper.is_alive() else raised
