"""The cpu kernels' process-wide scratch buffers. Sharing one set makes the kernels
non-reentrant across threads, as the engine's one-thread-per-process model runner
already is."""

from __future__ import annotations

from ....op_contracts.workspace import Workspace

#: The process-wide workspace of the cpu kernels.
WORKSPACE = Workspace()
