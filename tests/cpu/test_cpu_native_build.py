"""`_native.build_ahead`: a library whose build was started ahead is loaded from that
build (not compiled a second time), a build that fails ahead leaves the torch path with
the reason logged, and a process that did not start the build (a forked child, which
has not the threads that finish it) builds for itself instead of waiting on it. The
build cache: keyed on the sources' text and the library's optimisation level, not on
where the checkout lies."""

from __future__ import annotations

import ctypes
import logging
import shutil

import pytest

from accord.backends.cpu.kernels import _native

needs_compiler = pytest.mark.skipif(_native._compiler() is None, reason="needs a C compiler")

SOURCE = "int accord_test_add(int a, int b) { return a + b; }\n"
SIGNATURES = (("accord_test_add", ctypes.c_int, (ctypes.c_int, ctypes.c_int)),)


@pytest.fixture
def builds(tmp_path, monkeypatch):
    """A kernel folder of its own (the packed-call header copied in), an empty build
    cache, no builds started, and the list of sources `_build` compiles or reads."""
    kernels = tmp_path / "kernels"
    kernels.mkdir()
    shutil.copy(_native.KERNEL_DIR / "native_packed.h", kernels)
    monkeypatch.setattr(_native, "KERNEL_DIR", kernels)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    monkeypatch.setattr(_native, "_ahead", {})
    built: list[str] = []
    build = _native._build

    def counting_build(compiler, source, unit, optimization):
        built.append(source.name)
        return build(compiler, source, unit, optimization)

    monkeypatch.setattr(_native, "_build", counting_build)
    return kernels, built


@needs_compiler
def test_a_library_built_ahead_is_loaded_from_that_build(builds):
    kernels, built = builds
    (kernels / "ahead_ok.c").write_text(SOURCE)
    _native.build_ahead("ahead_ok.c", SIGNATURES)
    _native.build_ahead("ahead_ok.c", SIGNATURES)  # a second call starts nothing
    library = _native.load("ahead_ok.c", SIGNATURES)
    assert library is not None and library.accord_test_add(2, 3) == 5
    assert built == ["ahead_ok.c"]


@needs_compiler
def test_a_build_that_fails_ahead_gives_the_torch_path_and_says_why(builds, caplog):
    kernels, built = builds
    (kernels / "ahead_broken.c").write_text("int accord_test_add(int a, int b) { return a + ; }\n")
    _native.build_ahead("ahead_broken.c", SIGNATURES)
    with caplog.at_level(logging.WARNING, logger=_native.__name__):
        assert _native.load("ahead_broken.c", SIGNATURES) is None
    assert "building ahead_broken.c failed" in caplog.text and "error" in caplog.text
    assert built == ["ahead_broken.c"]


@needs_compiler
def test_a_process_that_did_not_start_the_build_builds_for_itself(builds, monkeypatch):
    kernels, built = builds
    (kernels / "ahead_forked.c").write_text(SOURCE)
    _native.build_ahead("ahead_forked.c", SIGNATURES)
    _native._ahead["ahead_forked.c"][1].result()  # the parent's build is done and cached
    parent = _native.os.getpid()
    monkeypatch.setattr(_native.os, "getpid", lambda: parent + 1)
    library = _native.load("ahead_forked.c", SIGNATURES)
    assert library is not None and library.accord_test_add(4, 5) == 9
    assert built == ["ahead_forked.c", "ahead_forked.c"]  # the child's own call (a cache hit)


@needs_compiler
def test_the_cache_is_keyed_on_the_sources_text_and_the_optimisation_level(builds, tmp_path, monkeypatch):
    kernels, built = builds
    (kernels / "keyed.c").write_text(SOURCE)
    first = _native._build("gcc", kernels / "keyed.c", _native.translation_unit(kernels / "keyed.c", SIGNATURES), "-O2")
    # The same sources in another checkout: the same build, read from the cache.
    elsewhere = tmp_path / "elsewhere"
    shutil.copytree(kernels, elsewhere)
    monkeypatch.setattr(_native, "KERNEL_DIR", elsewhere)
    unit = _native.translation_unit(elsewhere / "keyed.c", SIGNATURES)
    assert _native._build("gcc", elsewhere / "keyed.c", unit, "-O2") == first
    # Another optimisation level, or other text, is another build.
    assert _native._build("gcc", elsewhere / "keyed.c", unit, "-O1") != first
    (elsewhere / "keyed.c").write_text(SOURCE + "int accord_test_other(void) { return 1; }\n")
    changed = _native._build("gcc", elsewhere / "keyed.c", unit, "-O2")
    assert changed != first and ctypes.CDLL(str(changed)).accord_test_other() == 1


@needs_compiler
def test_a_library_is_built_at_its_own_optimisation_level(builds, monkeypatch):
    kernels, built = builds
    (kernels / "levels.c").write_text(SOURCE)
    commands: list[list[str]] = []
    run = _native.subprocess.run

    def recording_run(command, **kwargs):
        commands.append(command)
        return run(command, **kwargs)

    monkeypatch.setattr(_native.subprocess, "run", recording_run)
    library = _native.load("levels.c", SIGNATURES, "-O1")
    assert library is not None and library.accord_test_add(1, 1) == 2
    compiles = [command for command in commands if "-c" in command]  # the compile, not the link
    assert len(compiles) == 1 and "-O1" in compiles[0] and "-O3" not in compiles[0]


@needs_compiler
def test_a_source_outside_the_kernel_folder_builds_with_the_kernel_headers(builds, tmp_path):
    """A benchmark's baseline (another version of a kernel, saved elsewhere) is built
    from where it lies, still finding the headers beside the kernels."""
    kernels, built = builds
    (kernels / "helper.h").write_text("static inline int accord_test_twice(int a) { return 2 * a; }\n")
    baseline = tmp_path / "baseline" / "old_kernel.c"
    baseline.parent.mkdir()
    baseline.write_text('#include "helper.h"\nint accord_test_add(int a, int b) { return accord_test_twice(a) + b; }\n')
    library = _native.load(str(baseline), SIGNATURES)
    assert library is not None and library.accord_test_add(2, 3) == 7
