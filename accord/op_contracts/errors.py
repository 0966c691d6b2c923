"""The one error an illegal op call raises."""

from __future__ import annotations


class ContractError(TypeError):
    """An op call that its contract, or the active backend's declared support, refuses.

    It names the op, the argument, what was expected and what came, and the backend, so
    the message alone says where to look; it is raised before any kernel runs.
    """

    def __init__(
        self,
        op: str,
        arg: str,
        expected: str,
        got: str,
        backend: str | None = None,
        hint: str | None = None,
    ) -> None:
        self.op = op
        self.arg = arg
        self.expected = expected
        self.got = got
        self.backend = backend
        self.hint = hint
        where = f" on backend '{backend}'" if backend else ""
        message = f"{op}: {arg} expected {expected}, got {got}{where}"
        if hint:
            message += f"; {hint}"
        super().__init__(message)
