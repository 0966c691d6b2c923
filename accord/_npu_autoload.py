"""Keeps `import torch` working when torch-npu is installed without its CANN runtime.

torch imports every package of its `torch.backends` entry point group on `import torch`
(TORCH_DEVICE_BACKEND_AUTOLOAD, on by default), and torch-npu is one: without CANN's
shared libraries (what `pip install torch-npu` gives on a machine with no Ascend
toolkit) that import fails and takes `import torch` down with it. accord imports
torch-npu itself when the ascend backend is used, so it turns autoloading off before
torch is first imported, only in that broken case, and never over a user's setting.
Imports nothing but the standard library: it runs before torch is imported.
"""

from __future__ import annotations

import ctypes
import importlib.util
import os
import sys

AUTOLOAD_VARIABLE = "TORCH_DEVICE_BACKEND_AUTOLOAD"
#: CANN libraries torch-npu links against; the first one missing names the problem.
CANN_LIBRARIES = ("libascendcl.so", "libhccl.so")


def torch_npu_installed() -> bool:
    """Whether a torch_npu package is importable (found without importing it)."""
    return importlib.util.find_spec("torch_npu") is not None


def cann_runtime_missing() -> str | None:
    """Why CANN's runtime libraries cannot be loaded (the loader's message), or None
    when they can (the dynamic loader searches LD_LIBRARY_PATH, as CANN's set_env.sh
    sets it)."""
    for library in CANN_LIBRARIES:
        try:
            ctypes.CDLL(library)
        except OSError as error:
            return str(error)
    return None


def guard_torch_npu_autoload() -> bool:
    """Turn torch's backend autoloading off when torch-npu is installed but CANN is
    not, before torch is imported; returns whether it did. A no-op once torch is
    imported, without torch-npu, with CANN present, or when the user set the variable."""
    if "torch" in sys.modules or AUTOLOAD_VARIABLE in os.environ:
        return False
    if not torch_npu_installed() or cann_runtime_missing() is None:
        return False
    os.environ[AUTOLOAD_VARIABLE] = "0"
    return True
