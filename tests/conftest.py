"""Process-wide test settings, loaded before any test module imports accord or triton.

- Triton reads TRITON_INTERPRET when it is first imported, so it is set here (unless
  the caller set it, e.g. `TRITON_INTERPRET=0` on a GPU host): the Triton kernels then
  run on the CPU interpreter, and any test directory may import them first.
- Under pytest-xdist each worker gets its share of the cores for torch's intra-op
  threads; oversubscribed workers made kernels several times slower on 2-core CI.
- `forced_native_bf16` and `forced_fp32_bf16` put the cpu backend on one bf16 path
  for one test, for the cpu kernel tests and the engine tests alike, whatever the host.
- `ACCORD_TEST_CPU=avx2|avx512|avx512-bf16|amx` runs the tests as on that kind of CPU
  (see SIMULATED_CPUS): `.ci/run` reruns the ISA-sensitive tests under each, so a test
  whose outcome depends on the host's ISA fails on every host, not only on the one
  that differs.
"""

from __future__ import annotations

import os

os.environ.setdefault("TRITON_INTERPRET", "1")

#: The settings that make this process decide as it would on each kind of CPU these
#: machines have: torch's kernel capability, the highest ISA oneDNN may use (a cap, so
#: on a lesser host it changes nothing) and the cpu backend's bf16 path (native bf16 on
#: a host without it is emulated: slow, but the same decisions and results).
SIMULATED_CPUS = {
    "avx2": {"ATEN_CPU_CAPABILITY": "avx2", "ONEDNN_MAX_CPU_ISA": "AVX2", "ACCORD_CPU_BF16_PATH": "fp32"},
    "avx512": {"ATEN_CPU_CAPABILITY": "avx512", "ONEDNN_MAX_CPU_ISA": "AVX512_CORE", "ACCORD_CPU_BF16_PATH": "fp32"},
    "avx512-bf16": {
        "ATEN_CPU_CAPABILITY": "avx512",
        "ONEDNN_MAX_CPU_ISA": "AVX512_CORE_BF16",
        "ACCORD_CPU_BF16_PATH": "native",
    },
    "amx": {"ATEN_CPU_CAPABILITY": "avx512", "ONEDNN_MAX_CPU_ISA": "AVX512_CORE_AMX", "ACCORD_CPU_BF16_PATH": "native"},
}
if simulated := os.environ.get("ACCORD_TEST_CPU"):
    if simulated not in SIMULATED_CPUS:
        raise ValueError(f"ACCORD_TEST_CPU must be one of {sorted(SIMULATED_CPUS)}, got {simulated!r}")
    # Set before torch is imported: torch and oneDNN read them once. Subprocesses inherit them.
    os.environ.update(SIMULATED_CPUS[simulated])

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
