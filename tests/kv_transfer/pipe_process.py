"""A function run in a spawned process of its own and driven over a pipe, for the KV
transfer tests that need a second engine process."""

from __future__ import annotations

import multiprocessing
from collections.abc import Callable


class PipeProcess:
    """`target(*args, conn)` in a spawned process: it sends one message once ready
    (kept as `ready`), then answers each command sent to it; ("stop",) returns."""

    def __init__(self, target: Callable[..., None], *args: object, start_timeout_s: float = 120) -> None:
        context = multiprocessing.get_context("spawn")
        self.conn, child = context.Pipe()
        self.process = context.Process(target=target, args=(*args, child))
        self.process.start()
        if not self.conn.poll(start_timeout_s):
            self.kill()
            raise RuntimeError(f"{getattr(target, '__name__', target)} did not start in {start_timeout_s} s")
        self.ready = self.conn.recv()

    def call(self, *command: object) -> object:
        """Send `command`, return the process's answer."""
        self.conn.send(command)
        return self.conn.recv()

    def kill(self) -> None:
        """SIGKILL the process (a crash: nothing of its own runs on the way out)."""
        self.process.kill()
        self.process.join()

    def stop(self) -> None:
        """Let the process return, killing it if it does not within 30 s."""
        if self.process.is_alive():
            self.conn.send(("stop",))
            self.process.join(30)
        if self.process.is_alive():
            self.kill()
