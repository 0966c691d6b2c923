"""The call protocol every executor speaks with its workers, whatever carries it (a pipe
under mp, a Ray actor call under ray): a call is (method, args, kwargs); a reply is
("ok", result) or ("error", description, traceback text). A method that raises is
reported, never fatal to the worker; the engine turns error replies into WorkerError."""

from __future__ import annotations

import traceback
from collections.abc import Mapping, Sequence
from typing import Any

from ..errors import WorkerError

Reply = tuple[Any, ...]


def error_reply(error: BaseException) -> Reply:
    """The reply that reports `error` (raised just now) to the engine."""
    return ("error", f"{type(error).__name__}: {error}", traceback.format_exc())


def call_worker(worker: object, method: str, args: Sequence[Any], kwargs: Mapping[str, Any]) -> Reply:
    """Run `worker.method(*args, **kwargs)` and wrap its result or its error as a reply."""
    try:
        return ("ok", getattr(worker, method)(*args, **kwargs))
    except Exception as error:  # noqa: BLE001 - reported to the engine, the worker lives on
        return error_reply(error)


def reply_error(rank: int, reply: Reply) -> WorkerError | None:
    """The WorkerError an error reply from `rank` stands for; None for an ok reply."""
    return None if reply[0] == "ok" else WorkerError(rank, reply[1], reply[2])
