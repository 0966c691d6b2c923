"""Native kernels a user can rely on: importing the kernels compiles nothing, N
processes starting at once build a library once (a file lock beside the cache entry),
and a missing compiler is a WARNING naming the fallback, shown by `accord backends`."""

from __future__ import annotations

import logging
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from accord.backends.cpu import CpuBackend, capability
from accord.backends.cpu.kernels import _native
from accord.cli.commands import backends as backends_command

REPO = Path(__file__).resolve().parents[2]
needs_compiler = pytest.mark.skipif(capability.find_compiler() is None, reason="needs a C compiler")


def logging_compiler(tmp_path: Path, delay_s: float = 0.0) -> tuple[Path, Path]:
    """A compiler wrapper that logs each call's arguments (after `delay_s`, so builds
    started together overlap) and runs the real compiler; the wrapper and its log."""
    log = tmp_path / "compiler.log"
    wrapper = tmp_path / "cc-logging"
    wrapper.write_text(f'#!/bin/sh\nsleep {delay_s}\necho "$@" >> "{log}"\nexec "{capability.find_compiler()}" "$@"\n')
    wrapper.chmod(0o755)
    return wrapper, log


def environment(tmp_path: Path, compiler: Path) -> dict[str, str]:
    return {**os.environ, "CC": str(compiler), "XDG_CACHE_HOME": str(tmp_path / "cache"), "PYTHONPATH": str(REPO)}


@pytest.mark.slow
@needs_compiler
def test_importing_the_cpu_kernels_compiles_nothing(tmp_path: Path) -> None:
    compiler, log = logging_compiler(tmp_path)
    subprocess.run([sys.executable, "-c", "import accord.backends.cpu.kernels"],
                   env=environment(tmp_path, compiler), check=True, timeout=300)
    assert not log.exists(), f"the import ran the compiler: {log.read_text()}"


BUILD_ONCE = """
import ctypes, sys
from pathlib import Path
from accord.backends.cpu.kernels import _native
_native.KERNEL_DIR = Path(sys.argv[1])
library = _native.load("lock_test.c", (("accord_test_add", ctypes.c_int, (ctypes.c_int, ctypes.c_int)),))
print(library.accord_test_add(2, 3))
"""


@pytest.mark.slow
@needs_compiler
def test_processes_starting_together_build_a_library_once(tmp_path: Path) -> None:
    kernels = tmp_path / "kernels"
    kernels.mkdir()
    shutil.copy(_native.KERNEL_DIR / "native_packed.h", kernels)
    (kernels / "lock_test.c").write_text("int accord_test_add(int a, int b) { return a + b; }\n")
    compiler, log = logging_compiler(tmp_path, delay_s=1.0)
    env = environment(tmp_path, compiler)
    ranks = [
        subprocess.Popen([sys.executable, "-c", BUILD_ONCE, str(kernels)], env=env, stdout=subprocess.PIPE, text=True)
        for _ in range(2)
    ]
    outputs = [rank.communicate(timeout=300)[0] for rank in ranks]
    assert [rank.returncode for rank in ranks] == [0, 0] and [out.strip() for out in outputs] == ["5", "5"]
    builds = [line for line in log.read_text().splitlines() if "--version" not in line]
    assert len(builds) == 1, builds


def test_a_missing_compiler_is_a_warning_naming_the_fallback(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setattr(capability, "find_compiler", lambda: None)
    with caplog.at_level(logging.WARNING, logger=_native.__name__):
        assert _native.load("no_compiler_here.c", ()) is None
    assert [r.levelno for r in caplog.records] == [logging.WARNING]
    assert "torch paths" in caplog.text and "no C compiler" in caplog.text
    assert capability.NO_COMPILER_FALLBACK in CpuBackend().description
    backends_command.run(None)  # type: ignore[arg-type]
    cpu_row = next(line for line in capsys.readouterr().out.splitlines() if line.startswith("cpu "))
    assert "no C compiler" in cpu_row
