"""`accord backends` says precisely why ascend cannot run, `import accord` survives
torch-npu installed without CANN (torch's backend autoload would otherwise break
`import torch`), and `--backend auto` never picks the emulator or an incomplete backend."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
import types
from pathlib import Path

import pluggy
import pytest
import torch

from accord.backends import BackendRegistry, hookimpl
from accord.backends import ascend as ascend_module
from accord.backends.ascend import AscendBackend
from accord.backends.base import Backend
from accord.backends.registry import plugin_manager
from accord.op_contracts import KernelSet

REAL_SITE_VARIABLE = "ACCORD_TEST_TORCH_NPU_SITE"
REPO = Path(__file__).resolve().parents[2]


def _fake_torch_npu(root: Path) -> Path:
    """A torch-npu 2.13.0 distribution whose import fails as the real one does without
    CANN, registered in torch's `torch.backends` autoload group like the real one."""
    package = root / "torch_npu"
    package.mkdir()
    (package / "__init__.py").write_text(textwrap.dedent("""\
        raise ImportError("libhccl.so: cannot open shared object file: No such file or directory")
    """))
    info = root / "torch_npu-2.13.0.dist-info"
    info.mkdir()
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: torch-npu\nVersion: 2.13.0\n")
    (info / "entry_points.txt").write_text("[torch.backends]\ntorch_npu = torch_npu:_autoload\n")
    return root


@pytest.fixture(params=["simulated", "real wheel"])
def torch_npu_site(request, tmp_path) -> Path:
    """A directory holding torch-npu without CANN: the simulated one always; the real
    wheel unpacked where ACCORD_TEST_TORCH_NPU_SITE points (its install is 44 MB and
    would break everyone's `import torch` on a shared host, so CI does not install it)."""
    if request.param == "simulated":
        return _fake_torch_npu(tmp_path)
    site = os.environ.get(REAL_SITE_VARIABLE)
    if not site:
        pytest.skip(f"{REAL_SITE_VARIABLE} is unset: no unpacked torch-npu wheel to test against")
    return Path(site)


def _run(site: Path, *args: str, **env: str) -> subprocess.CompletedProcess[str]:
    environment = {k: v for k, v in os.environ.items() if k != "TORCH_DEVICE_BACKEND_AUTOLOAD"}
    environment |= {"PYTHONPATH": f"{site}{os.pathsep}{REPO}", **env}
    return subprocess.run([sys.executable, *args], capture_output=True, text=True, env=environment, timeout=120)


@pytest.mark.slow
def test_torch_npu_without_cann_breaks_a_bare_import_torch(torch_npu_site):
    """The failure the guard exists for, reproduced (so the other tests can fail)."""
    result = _run(torch_npu_site, "-c", "import torch")
    assert result.returncode != 0 and "Failed to load the backend extension: torch_npu" in result.stderr


@pytest.mark.slow
def test_import_accord_then_torch_works_with_torch_npu_without_cann(torch_npu_site):
    result = _run(torch_npu_site, "-c", "import os, accord, torch; print(os.environ['TORCH_DEVICE_BACKEND_AUTOLOAD'])")
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "0"


@pytest.mark.slow
def test_accord_backends_says_cann_is_missing(torch_npu_site):
    result = _run(torch_npu_site, "-m", "accord", "backends")
    assert result.returncode == 0, result.stderr
    line = next(line for line in result.stdout.splitlines() if line.startswith("ascend"))
    assert "unavailable" in line and "is installed but the CANN runtime is not" in line
    assert "cannot open shared object file" in line  # the loader's own message names the library


@pytest.mark.slow
def test_a_users_autoload_setting_is_left_alone(torch_npu_site):
    result = _run(torch_npu_site, "-c", "import accord, torch", TORCH_DEVICE_BACKEND_AUTOLOAD="1")
    assert result.returncode != 0 and "Failed to load the backend extension" in result.stderr


def test_without_torch_npu_the_reason_says_it_is_not_installed(monkeypatch):
    monkeypatch.setattr(ascend_module, "torch_npu_installed", lambda: False)
    availability = AscendBackend(emulate=False).availability()
    assert not availability.available and availability.reason.startswith("torch-npu is not installed")


def test_a_failing_torch_npu_import_is_reported_not_raised(monkeypatch):
    monkeypatch.setattr(ascend_module, "torch_npu_installed", lambda: True)
    monkeypatch.setitem(sys.modules, "torch_npu", None)  # import torch_npu now raises
    availability = AscendBackend(emulate=False).availability()
    assert not availability.available and "failed to import: ModuleNotFoundError" in availability.reason


def test_no_visible_npu_is_its_own_reason(monkeypatch):
    monkeypatch.setattr(ascend_module, "torch_npu_installed", lambda: True)
    monkeypatch.setitem(sys.modules, "torch_npu", types.ModuleType("torch_npu"))
    monkeypatch.setattr(torch, "npu", types.SimpleNamespace(is_available=lambda: False), raising=False)
    availability = AscendBackend(emulate=False).availability()
    assert not availability.available and "no NPU is visible" in availability.reason


def _registry_with(*backends: Backend) -> BackendRegistry:
    class Extra:
        @hookimpl
        def accord_backends(self):
            return list(backends)

    manager: pluggy.PluginManager = plugin_manager(load_entry_points=False)
    manager.register(Extra())
    return BackendRegistry(manager)


def test_auto_never_picks_the_emulator(monkeypatch):
    monkeypatch.setenv("ACCORD_NPU_EMULATE", "1")
    registry = _registry_with()
    assert registry.get("ascend").availability().available
    assert registry.get("auto").name != "ascend"


class _Partial(Backend):
    """A high-priority backend with one kernel only."""

    name, device_type, priority = "partial", "cpu", 1000

    def load_kernels(self) -> KernelSet:
        from accord.backends.cpu.kernels import KERNELS

        kernels = KernelSet()
        kernels.add(KERNELS.get("rms_norm"))
        return kernels


def test_auto_passes_over_a_backend_whose_kernels_are_incomplete():
    registry = _registry_with(_Partial())
    assert registry.get("partial").availability().available
    assert registry.get("auto").name != "partial"


def test_the_ascend_kernel_table_covers_every_contract(emulated):
    from accord.backends.registry import missing_kernels

    assert missing_kernels(emulated) == []


def test_hccl_contract_follows_cann_for_atlas_a2(emulated):
    from accord.op_contracts import ContractError

    support = emulated.collective_support()
    assert emulated.dist_backend == "hccl" and support.name == "hccl"
    assert support.plan("all_reduce", torch.bfloat16) is None
    assert support.plan("all_reduce", torch.float8_e4m3fn).kind == "upcast"
    assert support.plan("all_gather", torch.float8_e4m3fn).kind == "bytes"
    with pytest.raises(ContractError, match="all_reduce"):
        support.plan("all_reduce", torch.float64)  # HcclAllReduce has no fp64


def test_fp32_models_compute_in_bf16_as_fia_has_no_fp32(emulated):
    assert emulated.compute_dtype(torch.float32) == torch.bfloat16
    assert emulated.compute_dtype(torch.float16) == torch.float16
