"""Backend discovery: built-ins register through the pluggy hook, names resolve, and
unavailable backends say why instead of failing at import."""

from __future__ import annotations

import subprocess
import sys

import pytest

from accord.backends import BackendRegistry, BackendUnavailableError, UnknownBackendError, default_registry

BUILT_INS = {"reference", "cpu", "triton", "cuda", "rocm", "ascend"}


def test_every_built_in_is_registered():
    assert BUILT_INS <= set(default_registry().names())


def test_reference_and_cpu_are_available_on_this_host():
    for name in ("reference", "cpu"):
        assert default_registry().get(name).availability().available


def test_auto_picks_the_available_backend_of_highest_priority():
    registry = default_registry()
    expected = max((b for b in registry.all() if b.availability().available), key=lambda b: b.priority)
    assert registry.get("auto") is expected


def test_unknown_name_lists_the_supported_ones():
    with pytest.raises(UnknownBackendError, match=r"Unsupported backend: nope\. Supported items: \[.*'cpu'"):
        default_registry().get("nope")


@pytest.mark.skipif(
    __import__("torch").cuda.is_available(), reason="this host has a GPU, so cuda is available here"
)
def test_cuda_without_a_gpu_is_unavailable_with_a_reason():
    backend = default_registry().get("cuda", require_available=False)
    availability = backend.availability()
    assert not availability.available and availability.reason
    with pytest.raises(BackendUnavailableError, match="backend 'cuda' is unavailable: "):
        default_registry().get("cuda")


def test_two_plugins_claiming_one_name_is_an_error():
    import pluggy

    from accord.backends import hookimpl
    from accord.backends.registry import plugin_manager
    from accord.backends.reference import ReferenceBackend

    class Duplicate:
        @hookimpl
        def accord_backends(self):
            return [ReferenceBackend()]

    manager: pluggy.PluginManager = plugin_manager(load_entry_points=False)
    manager.register(Duplicate())
    with pytest.raises(ValueError, match="two plugins register a backend named 'reference'"):
        BackendRegistry(manager)


@pytest.mark.slow
def test_accord_backends_command_lists_every_backend_with_status():
    result = subprocess.run(
        [sys.executable, "-m", "accord", "backends"], capture_output=True, text=True, check=True
    )
    lines = {line.split()[0]: line for line in result.stdout.splitlines()[1:]}
    assert BUILT_INS <= lines.keys()
    assert "available" in lines["cpu"].split() and "available" in lines["reference"].split()
    if not __import__("torch").cuda.is_available():
        assert "unavailable" in lines["cuda"] and "no CUDA support" in lines["cuda"]
        assert "unavailable" in lines["rocm"] and "ROCm" in lines["rocm"]
