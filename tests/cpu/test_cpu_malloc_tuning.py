"""The cpu backend's glibc malloc settings: a block past glibc's mmap threshold comes
from the heap, not from a fresh mapping, once they are set (in a child process that
loads only that module: malloc's settings are the whole process's), and the backend
sets them when it loads its kernels."""

from __future__ import annotations

import ctypes
import os
import subprocess
import sys
from pathlib import Path

import pytest

import accord.backends.cpu.malloc_tuning as malloc_tuning
from accord.backends import get_backend

CHILD = r"""
import ctypes, importlib.util, sys

class Mallinfo2(ctypes.Structure):
    _fields_ = [(name, ctypes.c_size_t) for name in
                ("arena", "ordblks", "smblks", "hblks", "hblkhd", "usmblks", "fsmblks", "uordblks", "fordblks", "keepcost")]

libc = ctypes.CDLL(None)
libc.mallinfo2.restype = Mallinfo2
libc.malloc.restype, libc.malloc.argtypes = ctypes.c_void_p, [ctypes.c_size_t]
libc.free.argtypes = [ctypes.c_void_p]

def mapped_blocks_for_a_large_malloc():
    before = libc.mallinfo2().hblks
    block = libc.malloc(256 << 20)
    during = libc.mallinfo2().hblks
    libc.free(block)
    return during - before

spec = importlib.util.spec_from_file_location("malloc_tuning", sys.argv[1])
module = importlib.util.module_from_spec(spec)
spec.loader.exec_module(module)
untuned = mapped_blocks_for_a_large_malloc()
tuned = module.tune_glibc_malloc()
print(untuned, tuned, mapped_blocks_for_a_large_malloc())
"""


def _has_mallinfo2() -> bool:
    return hasattr(ctypes.CDLL(None), "mallinfo2")


@pytest.mark.skipif(not sys.platform.startswith("linux") or not _has_mallinfo2(), reason="needs glibc 2.33+ (mallinfo2)")
@pytest.mark.parametrize(("setting", "expected"), [("1", "1 True 0"), ("0", "1 False 1")])
def test_a_large_block_comes_from_the_heap_once_malloc_is_tuned(setting: str, expected: str) -> None:
    """Before, glibc maps a 256 MiB block of its own; after, it takes it from the heap;
    with ACCORD_CPU_MALLOC_TUNING=0 nothing is set and it still maps it."""
    env = {**os.environ, malloc_tuning.TUNING_VARIABLE: setting}
    result = subprocess.run([sys.executable, "-c", CHILD, str(Path(malloc_tuning.__file__))], env=env,
                            capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == expected


def test_the_backend_tunes_malloc_when_it_loads_its_kernels(monkeypatch: pytest.MonkeyPatch) -> None:
    calls: list[bool] = []
    monkeypatch.setattr(malloc_tuning, "tune_glibc_malloc", lambda: calls.append(True) or True)
    get_backend("cpu").load_kernels()
    assert calls == [True]
