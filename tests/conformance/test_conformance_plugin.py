"""A third-party backend package, installed the way an editable install leaves it (a
dist-info with entry_points.txt on the path), is discovered through the
`accord.backends` entry point group and checked by `accord conformance`."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from accord.backends.registry import BackendRegistry, plugin_manager

tomllib = pytest.importorskip("tomllib", reason="reading the plugin's pyproject needs Python 3.11's tomllib")

PLUGIN = Path(__file__).parents[1] / "plugins" / "accord_demo_backend"


def _install(site: Path) -> None:
    """Write the dist-info that `pip install -e` would, from the plugin's pyproject."""
    project = tomllib.loads((PLUGIN / "pyproject.toml").read_text())["project"]
    dist_info = site / f"{project['name'].replace('-', '_')}-{project['version']}.dist-info"
    dist_info.mkdir(parents=True)
    metadata = f"Metadata-Version: 2.1\nName: {project['name']}\nVersion: {project['version']}\n"
    (dist_info / "METADATA").write_text(metadata)
    lines = [
        line
        for group, points in project["entry-points"].items()
        for line in (f"[{group}]", *(f"{name} = {target}" for name, target in points.items()))
    ]
    (dist_info / "entry_points.txt").write_text("\n".join(lines) + "\n")


@pytest.fixture(scope="module")
def site(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("site")
    _install(path)
    return path


def test_the_plugin_is_discovered_through_its_entry_point(site: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.syspath_prepend(str(PLUGIN))
    monkeypatch.syspath_prepend(str(site))
    assert "demo" in BackendRegistry(plugin_manager()).names()


def test_the_plugin_is_not_there_without_installing_it() -> None:
    assert "demo" not in BackendRegistry(plugin_manager()).names()


@pytest.mark.slow
def test_conformance_runs_the_discovered_plugin_and_reports_what_it_lacks(site: Path) -> None:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(site), str(PLUGIN), os.environ.get("PYTHONPATH", "")])}
    command = [sys.executable, "-m", "accord", "conformance", "--backend", "demo",
               "--op", "rms_norm", "--op", "silu_and_mul", "--op", "moe_route"]
    done = subprocess.run(command, env=env, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stdout + done.stderr
    assert _row(done.stdout, "rms_norm", "x,weight=bf16").count(" pass ") == 1
    assert " pass " in _row(done.stdout, "silu_and_mul", "x=fp32")
    assert " unsupported " in _row(done.stdout, "silu_and_mul", "x=bf16")
    assert " unsupported " in _row(done.stdout, "moe_route", "router_logits=fp32 ids_dtype=int32")


def _row(table: str, op: str, combo: str) -> str:
    """The table line of (op, combo)."""
    (line,) = [line for line in table.splitlines() if line.startswith(f"{op} ") and f" {combo} " in line]
    return line
