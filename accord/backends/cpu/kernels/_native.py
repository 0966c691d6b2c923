"""Native cpu kernels: a C source file beside this module, built once per host with the
system C compiler, cached, and loaded through ctypes.

Plain C with no torch headers builds in about a second (a torch C++ extension takes tens
of seconds), so even a cold start-up stays short; `-march=native` makes it the host's
vector code, so the cache key holds the source (with the headers beside it), the
compiler, its flags and the CPU's flags, and a cache shared between different hosts
never serves one the other's build.
A library links against the OpenMP runtime torch itself loaded (`openmp_runtime`, read
from this process's memory maps: a PyPI wheel's renamed `torch/lib/libgomp-<hash>.so.1`,
a local build's libgomp.so.1, Intel's libiomp5), not whichever libgomp the compiler
would pick, so the process holds one OpenMP runtime and one thread pool.
Without a C compiler (or when a build fails) `load` gives None, with a WARNING naming
the fallback, and callers keep their torch path. Nothing is compiled at import:
`build_ahead` (which the backend calls when it loads its kernels) starts a library's
build in the background, so that a cold start-up compiles its kernels side by side (one
compiler per library) while it loads the weights. A build holds a file lock beside its
cache entry, so processes starting together (the ranks of `-tp N`) build it once.
Building at first use rather than at install is a choice: the build is the host's own
(`-march=native`, and linked against the OpenMP runtime the running torch loaded), which
an install on an image builder or another CPU cannot know; a cold build of the three
libraries side by side took 27 s of wall time (11 s of compiler CPU) on a loaded 2-core
Sapphire Rapids while other work ran, a cached load 0.04 s.

Each entry point is also built in a packed form, `long NAME__packed(const
accord_packed_arg *args)`, generated here from its signature: the one calling convention
in which `_native_graph` replays recorded calls from a C loop. Calls go through
`NativeFunction`, which hands each call to `recorder` while one is set (a capture).
"""

from __future__ import annotations

import ctypes
import fcntl
import hashlib
import logging
import os
import re
import subprocess
import tempfile
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from functools import cache
from pathlib import Path
from typing import Any, Callable

from .. import capability

logger = logging.getLogger(__name__)

#: The flags of every compile; each library adds its own optimisation level (`load`).
FLAGS = ("-march=native", "-fopenmp", "-fPIC")
#: A mapped file that is an OpenMP runtime: GNU's (a wheel renames it libgomp-<hash>),
#: Intel's, LLVM's.
OPENMP_RUNTIME = re.compile(r"/lib(?:gomp|iomp5|omp)(?:-[0-9a-f]+)?\.so(?:\.\d+)*$")
#: The optimisation level of a library that names none (its `LIBRARY` has no third field).
DEFAULT_OPTIMIZATION = "-O3"
KERNEL_DIR = Path(__file__).parent

#: The member of the packed-argument union (native_packed.h) each ctypes argument type
#: travels in: pointers, integers (C converts them to the parameter's width) and floats.
PACKED_MEMBER = {ctypes.c_void_p: "p", ctypes.c_long: "i", ctypes.c_int: "i", ctypes.c_float: "d", ctypes.c_double: "d"}


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


def openmp_runtime(maps: str | None = None) -> Path | None:
    """The OpenMP runtime loaded in this process (torch loads its own on import), from
    `/proc/self/maps` (or the `maps` text given); None where none is mapped (torch
    built without OpenMP) or the maps cannot be read (not Linux): the build then links
    the compiler's own, as `-fopenmp` does."""
    if maps is None:
        try:
            maps = Path("/proc/self/maps").read_text()
        except OSError:
            return None
    for line in maps.splitlines():
        path = line.split()[-1] if line.split() else ""
        if OPENMP_RUNTIME.search(path):
            return Path(path)
    return None


def _build(compiler: str, source: Path, unit: str, optimization: str) -> Path:
    """The library of the translation unit `unit` (which includes `source`), built with
    `optimization` (a -O flag), from the cache or built into it."""
    version = subprocess.run([compiler, "--version"], capture_output=True, text=True, check=True).stdout
    # The headers beside the source (shared helpers it may include) are part of its text.
    headers = [header.read_text() for header in sorted(KERNEL_DIR.glob("*.h"))]
    runtime = str(openmp_runtime() or "")
    key = hashlib.sha256(
        "\0".join([unit, source.read_text(), *headers, optimization, " ".join(FLAGS), version, _cpu_flags(), runtime])
        .encode()
    )
    library = _cache_dir() / f"{source.stem}-{key.hexdigest()[:16]}.so"
    if library.is_file():
        return library
    library.parent.mkdir(parents=True, exist_ok=True)
    # One build per cache entry across processes (the N ranks of `-tp N` start at once):
    # the first takes the lock beside the entry and builds, the others wait and load it.
    with open(library.with_name(library.name + ".lock"), "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if not library.is_file():
            _compile(compiler, source, unit, optimization, library)
    return library


def _compile(compiler: str, source: Path, unit: str, optimization: str, library: Path) -> None:
    """Compile `unit` into `library`."""
    # Build beside the target and rename: concurrent start-ups never load a half-written file.
    with tempfile.TemporaryDirectory(dir=library.parent) as scratch:
        built, unit_file = Path(scratch) / library.name, Path(scratch) / f"{source.stem}_unit.c"
        unit_file.write_text(unit)
        # The source's own folder first: a source from elsewhere (a benchmark's baseline)
        # is included by name too.
        include = ("-I", str(source.parent)) if source.parent != KERNEL_DIR else ()
        objects = Path(scratch) / f"{source.stem}.o"
        compile_ = [compiler, optimization, *FLAGS, *include, "-I", str(KERNEL_DIR), "-c", "-o", str(objects), str(unit_file)]
        subprocess.run(compile_, capture_output=True, text=True, check=True)
        subprocess.run([compiler, "-shared", "-o", str(built), str(objects), *_openmp_link()],
                       capture_output=True, text=True, check=True)
        os.replace(built, library)


def _openmp_link() -> tuple[str, ...]:
    """How a library links OpenMP: against torch's loaded runtime by path (its soname is
    what the library then needs, so the loader finds the runtime already mapped), with
    its folder as the rpath; else the compiler's runtime (`-fopenmp`)."""
    runtime = openmp_runtime()
    if runtime is None:
        return ("-fopenmp",)
    return (str(runtime), f"-Wl,-rpath,{runtime.parent}")


#: An entry point's C signature: (name, return type or None, argument types).
Signature = tuple[str, Any, tuple[Any, ...]]


@dataclass(frozen=True)
class Int64Struct:
    """A C struct of int64 fields (pointers as addresses) that a kernel takes one
    pointer to, declared here once: the build writes `struct NAME { int64_t ...; }`
    into the translation unit ahead of the source, and Python packs its values with
    `layout`, in `fields` order. One argument instead of thirty, because a ctypes call
    costs about half a microsecond per argument on a slow host."""

    name: str
    fields: tuple[str, ...]

    @property
    def layout(self) -> str:
        """The `struct` module's format of the C struct: one native int64 per field."""
        return f"{len(self.fields)}q"

    def declaration(self) -> str:
        """The C definition the kernel source is compiled with."""
        return f"struct {self.name} {{ {' '.join(f'int64_t {field};' for field in self.fields)} }};"

#: Called with (function, arguments, result) after every native call while set: the
#: capture of `_native_graph` sets it, nothing else does.
recorder: Callable[[NativeFunction, tuple[Any, ...], Any], None] | None = None


class NativeFunction:
    """One typed entry point of a built library, called like the ctypes function it
    wraps; `packed` is its packed form (the replay's calling convention)."""

    __slots__ = ("name", "members", "packed", "_entry")

    def __init__(self, library: ctypes.CDLL, signature: Signature) -> None:
        name, restype, argtypes = signature
        self.name = name
        self.members = "".join(PACKED_MEMBER[argtype] for argtype in argtypes)
        self._entry = getattr(library, name)
        self._entry.restype, self._entry.argtypes = restype, list(argtypes)
        self.packed = ctypes.cast(getattr(library, f"{name}__packed"), ctypes.c_void_p).value

    def __call__(self, *args: Any) -> Any:
        result = self._entry(*args)
        if recorder is not None:
            recorder(self, args, result)
        return result


class NativeLibrary:
    """A built library's entry points (`NativeFunction`s) as attributes."""

    def __init__(self, library: ctypes.CDLL, signatures: tuple[Signature, ...]) -> None:
        for signature in signatures:
            setattr(self, signature[0], NativeFunction(library, signature))


def translation_unit(source: Path, signatures: tuple[Signature, ...], structs: tuple[Int64Struct, ...] = ()) -> str:
    """The C that is built: the declarations of `structs`, `source` itself, then each
    entry point's packed form, which unpacks its arguments from the union array and
    returns the result as a long (0 for a void function)."""
    # By name (the build's include path is KERNEL_DIR), so the unit and with it the cache
    # key hold the sources' text, not where this checkout lies: another checkout of the
    # same sources finds the same build.
    declarations = ["#include <stdint.h>", *(struct.declaration() for struct in structs)] if structs else []
    lines = [*declarations, f'#include "{source.name}"', '#include "native_packed.h"']
    for name, restype, argtypes in signatures:
        call = f"{name}({', '.join(f'args[{i}].{PACKED_MEMBER[t]}' for i, t in enumerate(argtypes))})"
        body = f"{call}; return 0;" if restype is None else f"return (long){call};"
        lines.append(f"long {name}__packed(const accord_packed_arg *args) {{ {body} }}")
    return "\n".join(lines) + "\n"


def _compiler() -> str | None:
    return capability.find_compiler()


#: Builds `build_ahead` started, by source name, with the pid of the process that started
#: them (a forked child has not the threads that would finish them: it builds itself).
_ahead: dict[str, tuple[int, Future[Path]]] = {}


@cache
def _builders() -> ThreadPoolExecutor:
    return ThreadPoolExecutor(max_workers=os.cpu_count() or 1, thread_name_prefix="accord-cc")


def build_ahead(
    source_name: str, signatures: tuple[Signature, ...], optimization: str = DEFAULT_OPTIMIZATION,
    structs: tuple[Int64Struct, ...] = (),
) -> None:
    """Start building what `load(source_name, signatures, optimization, structs)` loads, in the
    background (a compiler process of its own), once per process: call it before the
    first `load` (a build that is cached already only reads the cache key). Building the cpu kernels
    one after another at their first use took ~9 s of a cold start-up on a busy 2-core
    host (4.5, 2.9 and 1.5 s); side by side it takes the longest one."""
    compiler = _compiler()
    if compiler is None or source_name in _ahead:
        return
    source = KERNEL_DIR / source_name
    unit = translation_unit(source, signatures, structs)
    _ahead[source_name] = (os.getpid(), _builders().submit(_build, compiler, source, unit, optimization))


@cache
def load(
    source_name: str, signatures: tuple[Signature, ...], optimization: str = DEFAULT_OPTIMIZATION,
    structs: tuple[Int64Struct, ...] = (),
) -> NativeLibrary | None:
    """The library built from the C file `source_name` beside this module (on first use,
    or by `build_ahead`, then from the cache) with the entry points of `signatures`;
    None where it cannot be built, with the reason logged. `optimization` is the
    library's own -O flag: a cheaper one where it builds as fast a kernel in less of a
    cold start-up; `structs` the argument structs its source is compiled with."""
    compiler = _compiler()
    if compiler is None:
        logger.warning("%s is not built: %s", source_name, capability.NO_COMPILER_FALLBACK)
        return None
    source = KERNEL_DIR / source_name
    pid, ahead = _ahead.get(source_name, (None, None))
    try:
        if ahead is not None and pid == os.getpid():
            built = ahead.result()
        else:
            built = _build(compiler, source, translation_unit(source, signatures, structs), optimization)
        library = ctypes.CDLL(str(built))
    except (OSError, subprocess.CalledProcessError) as error:
        detail = getattr(error, "stderr", "") or error
        logger.warning("building %s failed, its torch path runs instead: %s", source_name, detail)
        return None
    return NativeLibrary(library, signatures)
