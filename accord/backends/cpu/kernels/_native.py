"""Native cpu kernels: a C source file beside this module, built once per host with the
system C compiler, cached, and loaded through ctypes.

Plain C with no torch headers builds in about a second (a torch C++ extension takes tens
of seconds), so even a cold start-up stays short; `-march=native` makes it the host's
vector code, so the cache key holds the source (with the headers beside it), the
compiler, its flags and the CPU's flags, and a cache shared between different hosts
never serves one the other's build.
`-fopenmp` links torch's own libgomp (already loaded), so there is one OpenMP runtime.
Without a C compiler (or when a build fails) `load` gives None and callers keep their
torch path.
"""

from __future__ import annotations

import ctypes
import hashlib
import logging
import os
import shutil
import subprocess
import tempfile
from functools import cache
from pathlib import Path
from typing import Any

logger = logging.getLogger(__name__)

FLAGS = ("-O3", "-march=native", "-fopenmp", "-shared", "-fPIC")


def _cache_dir() -> Path:
    """Where built libraries are kept (one per source, compiler and host ISA)."""
    base = os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache"
    return Path(base) / "accord" / "kernels"


def _cpu_flags() -> str:
    try:
        with open("/proc/cpuinfo") as cpuinfo:
            for line in cpuinfo:
                if line.startswith(("flags", "Features")):
                    return line
    except OSError:
        pass
    return ""


def _build(compiler: str, source: Path) -> Path:
    version = subprocess.run([compiler, "--version"], capture_output=True, text=True, check=True).stdout
    # The headers beside the source (shared helpers it may include) are part of its text.
    headers = [header.read_text() for header in sorted(source.parent.glob("*.h"))]
    key = hashlib.sha256("\0".join([source.read_text(), *headers, " ".join(FLAGS), version, _cpu_flags()]).encode())
    library = _cache_dir() / f"{source.stem}-{key.hexdigest()[:16]}.so"
    if library.is_file():
        return library
    library.parent.mkdir(parents=True, exist_ok=True)
    # Build beside the target and rename: concurrent start-ups never load a half-written file.
    with tempfile.TemporaryDirectory(dir=library.parent) as scratch:
        built = Path(scratch) / library.name
        subprocess.run([compiler, *FLAGS, "-o", str(built), str(source)], capture_output=True, text=True, check=True)
        os.replace(built, library)
    return library


#: An entry point's C signature: (name, return type or None, argument types).
Signature = tuple[str, Any, tuple[Any, ...]]


@cache
def load(source_name: str, signatures: tuple[Signature, ...]) -> ctypes.CDLL | None:
    """The library built from the C file `source_name` beside this module (built on first
    use, then from the cache) with the entry points of `signatures` typed; None where it
    cannot be built, with the reason logged."""
    compiler = os.environ.get("CC") or shutil.which("gcc") or shutil.which("cc")
    if compiler is None:
        logger.info("no C compiler found: %s is not built, its torch path runs instead", source_name)
        return None
    try:
        library = ctypes.CDLL(str(_build(compiler, Path(__file__).with_name(source_name))))
    except (OSError, subprocess.CalledProcessError) as error:
        detail = getattr(error, "stderr", "") or error
        logger.warning("building %s failed, its torch path runs instead: %s", source_name, detail)
        return None
    for name, restype, argtypes in signatures:
        entry = getattr(library, name)
        entry.restype, entry.argtypes = restype, list(argtypes)
    return library
