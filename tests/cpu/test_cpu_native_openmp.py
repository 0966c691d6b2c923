"""The native kernels link against the OpenMP runtime torch itself loaded, found in the
process's memory maps (a PyPI wheel ships it renamed, libgomp-<hash>.so.1), so loading
a library maps no second OpenMP runtime."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest
import torch  # noqa: F401  (loads torch's OpenMP runtime, as the backend's process has)

from accord.backends.cpu import capability
from accord.backends.cpu.kernels import _native

WHEEL_RUNTIME = "/venv/lib/python3.11/site-packages/torch/lib/libgomp-a34b3233.so.1"


def maps_line(path: str) -> str:
    return f"7f3a1c000000-7f3a1c02f000 r-xp 00004000 08:01 1234567                    {path}"


@pytest.mark.parametrize("runtime", [
    WHEEL_RUNTIME, "/usr/lib/x86_64-linux-gnu/libgomp.so.1", "/opt/intel/lib/libiomp5.so",
])
def test_the_loaded_runtime_is_found_in_the_maps(runtime: str) -> None:
    maps = "\n".join([maps_line("/usr/lib/libc.so.6"), maps_line(runtime), maps_line("/usr/lib/libgompish-tool.so"), ""])
    assert _native.openmp_runtime(maps) == Path(runtime)


def test_no_runtime_mapped_is_none() -> None:
    assert _native.openmp_runtime("\n".join([maps_line("/usr/lib/libc.so.6"), "7f00-7f01 rw-p 0 00:00 0"])) is None


def dynamic_entries(library: Path, kind: str) -> list[str]:
    """The values of `library`'s dynamic-section entries of `kind` (NEEDED, SONAME, RUNPATH)."""
    out = subprocess.run(["readelf", "-d", str(library)], capture_output=True, text=True, check=True).stdout
    return [line.split("[", 1)[1].rstrip("]") for line in out.splitlines() if f"({kind})" in line]


@pytest.mark.skipif(capability.find_compiler() is None or shutil.which("readelf") is None,
                    reason="needs a C compiler and readelf")
def test_a_built_library_needs_torchs_runtime_and_no_other(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    runtime = _native.openmp_runtime()
    assert runtime is not None, "torch loaded no OpenMP runtime this test can find"
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    source = _native.KERNEL_DIR / "elementwise.c"
    built = _native._build(capability.find_compiler(), source, _native.translation_unit(source, ()), "-O0")
    (soname,) = dynamic_entries(runtime, "SONAME")
    openmp_needed = [name for name in dynamic_entries(built, "NEEDED") if "omp" in name]
    assert openmp_needed == [soname]
    assert str(runtime.parent) in dynamic_entries(built, "RUNPATH")[0].split(":")


@pytest.mark.skipif(capability.find_compiler() is None, reason="needs a C compiler")
def test_an_argument_struct_is_declared_once_and_the_c_side_reads_its_layout(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The build defines the struct from its Python declaration: C reads each field at
    the offset Python packs it at (paged attention's decode call, as the kernel gets it)."""
    import ctypes
    import struct

    from accord.backends.cpu.kernels._native_attention import CALL_LAYOUT, PAGED_CALL

    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    monkeypatch.setattr(_native, "KERNEL_DIR", tmp_path)
    shutil.copy(Path(_native.__file__).parent / "native_packed.h", tmp_path)
    (tmp_path / "layout_probe.c").write_text(
        "long probe_field(const struct paged_call *call, long index) {\n"
        "    return ((const int64_t *)call)[index] == call->sliding_window ? index : -1;\n}\n"
    )
    signature = ("probe_field", ctypes.c_long, (ctypes.c_void_p, ctypes.c_long))
    library = _native.load("layout_probe.c", (signature,), "-O0", (PAGED_CALL,))
    assert library is not None
    index = PAGED_CALL.fields.index("sliding_window")
    packed = struct.pack(CALL_LAYOUT, *range(100, 100 + len(PAGED_CALL.fields)))
    assert library.probe_field(packed, index) == index
    assert struct.calcsize(CALL_LAYOUT) == 8 * len(PAGED_CALL.fields)
