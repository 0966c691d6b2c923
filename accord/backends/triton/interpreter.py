"""Whether Triton runs its kernels on the CPU (a module of its own, so the kernels
read it without importing the backend)."""

from __future__ import annotations

import os


def triton_interpreter_enabled() -> bool:
    """Whether TRITON_INTERPRET=1 asks Triton to run kernels on the CPU."""
    return os.environ.get("TRITON_INTERPRET", "0") == "1"
