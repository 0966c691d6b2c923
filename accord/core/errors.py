"""Errors the engine reports to its callers."""

from __future__ import annotations


class EngineDeadError(RuntimeError):
    """The engine cannot go on (a worker died, or the engine loop failed); every request
    in flight gets this error and no new one is accepted."""


class RequestFailedError(RuntimeError):
    """A step running this request failed because of it; the request was ended, the
    engine lives on."""


class WorkerError(RuntimeError):
    """A method raised inside a worker (the worker lives on); names the rank and carries
    the worker's traceback text."""

    def __init__(self, rank: int, description: str, traceback_text: str = "") -> None:
        super().__init__(f"worker rank {rank}: {description}")
        self.rank = rank
        self.traceback_text = traceback_text


class WorkerStartupError(RuntimeError):
    """A worker could not start (bad model, backend, flag, or it died); names the rank
    and the cause."""
