"""Process-wide test settings, loaded before any test module imports accord or triton.

- Triton reads TRITON_INTERPRET when it is first imported, so it is set here (unless
  the caller set it, e.g. `TRITON_INTERPRET=0` on a GPU host): the Triton kernels then
  run on the CPU interpreter, and any test directory may import them first.
- Under pytest-xdist each worker gets its share of the cores for torch's intra-op
  threads; oversubscribed workers made kernels several times slower on 2-core CI.
"""

from __future__ import annotations

import os

os.environ.setdefault("TRITON_INTERPRET", "1")

import torch  # noqa: E402


def pytest_configure(config) -> None:
    workers = int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1"))
    torch.set_num_threads(max(1, (os.cpu_count() or 1) // workers))
