"""The pinned environment a report records: what was tested (accord version and commit,
the deploy config and its hash) and where (python, torch, triton, the backend's vendor
libraries, driver, device name and architecture)."""

from __future__ import annotations

import hashlib
import json
import os
import platform
import subprocess
from datetime import datetime, timezone
from importlib import metadata
from pathlib import Path
from typing import Any, Mapping

import torch

from ... import __version__
from ...backends import Backend

#: Set by an image build where the source tree is not a git checkout.
COMMIT_ENV = "ACCORD_GIT_COMMIT"
UNKNOWN = "unknown"


def capture_environment(backend: Backend, deploy_config: Mapping[str, Any] | None = None) -> dict[str, Any]:
    """Everything a reader needs to reproduce the run, as JSON-ready data."""
    device_name, device_arch = _device(backend)
    return {
        "accord_version": __version__,
        "git_commit": git_commit(),
        "created": datetime.now(timezone.utc).isoformat(timespec="seconds"),
        "hostname": platform.node(),
        "platform": platform.platform(),
        "python": platform.python_version(),
        "torch": torch.__version__,
        "triton": _distribution_version("triton"),
        "libraries": dict(backend.versions()),
        "driver": _driver(backend),
        "device_name": device_name,
        "device_arch": device_arch,
        "backend": backend.name,
        "deploy_config": dict(deploy_config) if deploy_config is not None else None,
        "deploy_config_hash": config_hash(deploy_config) if deploy_config is not None else None,
    }


def config_hash(config: Mapping[str, Any]) -> str:
    """sha256 of the config as canonical JSON, so equal configs hash equal whatever
    their YAML key order or comments."""
    canonical = json.dumps(config, sort_keys=True, separators=(",", ":"), default=str)
    return "sha256:" + hashlib.sha256(canonical.encode()).hexdigest()


def git_commit() -> str:
    """The commit accord runs from: $ACCORD_GIT_COMMIT in an image, else the checkout's
    HEAD (with `-dirty` when it has local changes), else `unknown`."""
    if os.environ.get(COMMIT_ENV):
        return os.environ[COMMIT_ENV]
    source = Path(__file__).resolve().parents[3]
    try:
        head = _git(source, "rev-parse", "HEAD")
        dirty = _git(source, "status", "--porcelain", "--untracked-files=no")
    except (OSError, subprocess.CalledProcessError):
        return UNKNOWN
    return f"{head}-dirty" if dirty else head


def _git(directory: Path, *args: str) -> str:
    done = subprocess.run(
        ["git", "-C", str(directory), *args], capture_output=True, text=True, check=True, timeout=10
    )
    return done.stdout.strip()


def _distribution_version(name: str) -> str | None:
    try:
        return metadata.version(name)
    except metadata.PackageNotFoundError:
        return None


def _device(backend: Backend) -> tuple[str, str]:
    """(name, architecture) of the device the backend computes on."""
    kind = backend.device().type
    if kind == "cuda" and torch.cuda.is_available():
        properties = torch.cuda.get_device_properties(0)
        # ROCm builds report the gfx target; CUDA builds the compute capability.
        arch = getattr(properties, "gcnArchName", "") or f"sm_{properties.major}{properties.minor}"
        return properties.name, arch
    if kind == "cpu":
        return _cpu_model(), platform.machine()
    return kind, UNKNOWN


def _cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or UNKNOWN


def _driver(backend: Backend) -> str | None:
    """The device runtime's version (CUDA or HIP) where the device has one."""
    if backend.device().type != "cuda":
        return None
    return f"hip {torch.version.hip}" if torch.version.hip else f"cuda {torch.version.cuda}"
