"""Process-wide test settings, loaded before any test module imports accord or triton.

- Triton reads TRITON_INTERPRET when it is first imported, so it is set here (unless
  the caller set it, e.g. `TRITON_INTERPRET=0` on a GPU host): the Triton kernels then
  run on the CPU interpreter, and any test directory may import them first.
- Under pytest-xdist each worker gets its share of the cores for torch's intra-op
  threads; oversubscribed workers made kernels several times slower on 2-core CI.
- `forced_native_bf16` and `forced_fp32_bf16` put the cpu backend on one bf16 path
  for one test, for the cpu kernel tests and the engine tests alike, whatever the host.
"""

from __future__ import annotations

import os

os.environ.setdefault("TRITON_INTERPRET", "1")

import pytest  # noqa: E402
import torch  # noqa: E402


def pytest_configure(config) -> None:
    workers = int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1"))
    torch.set_num_threads(max(1, (os.cpu_count() or 1) // workers))


def _forced_bf16_path(monkeypatch: pytest.MonkeyPatch, path: str):
    """Put the cpu backend on one bf16 path (`native` or `fp32`) through
    ACCORD_CPU_BF16_PATH; the cached CPU answer is cleared before and after, so neither
    the forcing nor this host's own answer leaks into another test."""
    from accord.backends import cpu as cpu_backend

    monkeypatch.setenv(cpu_backend.BF16_PATH_VARIABLE, path)
    cpu_backend.cpu_has_native_bf16.cache_clear()
    yield
    monkeypatch.undo()
    cpu_backend.cpu_has_native_bf16.cache_clear()


@pytest.fixture
def forced_native_bf16(monkeypatch: pytest.MonkeyPatch):
    """The cpu backend takes its native-bf16 path (bf16 compute, as on AVX512-BF16 or AMX
    CPUs; emulated, slowly, where the CPU lacks them) for one test."""
    yield from _forced_bf16_path(monkeypatch, "native")


@pytest.fixture
def forced_fp32_bf16(monkeypatch: pytest.MonkeyPatch):
    """The cpu backend computes bf16/fp16 models in fp32 for one test, as on CPUs without
    AVX512-BF16 or AMX, whatever this host has."""
    yield from _forced_bf16_path(monkeypatch, "fp32")
