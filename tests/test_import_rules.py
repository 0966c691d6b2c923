"""The import rules between accord's packages, read from the source (every import,
lazy ones inside functions included), so a loop between packages cannot come back:
op_contracts imports nothing of accord; backends only op_contracts; core only
op_contracts (never a backend, not even the plugin interface: the caller hands it
one, and the device facts it reads are the protocol in accord/core/device.py); conformance neither the gate, the server nor
the CLI; entrypoints (the public LLM/AsyncLLM with backends found by name) sit on core
and backends; the gate sits above conformance and server; only the CLI sees everything."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

PACKAGE_ROOT = Path(__file__).resolve().parents[1] / "accord"
#: The accord packages each package may import (besides itself).
ALLOWED: dict[str, set[str]] = {
    "op_contracts": set(),
    # _npu_autoload: a standard-library-only shim the Ascend backend installs before torch.
    "_npu_autoload": set(),
    "backends": {"op_contracts", "_npu_autoload"},
    "core": {"op_contracts"},
    # core: the collective conformance runs ranks on core's distributed setup.
    "conformance": {"op_contracts", "backends", "core"},
    "demo": set(),
    "entrypoints": {"op_contracts", "backends", "core", "demo"},
    "server": {"op_contracts", "backends", "core"},
    "gate": {"op_contracts", "backends", "core", "entrypoints", "conformance", "server"},
    "cli": {"op_contracts", "backends", "core", "entrypoints", "conformance", "server", "gate", "demo"},
}


def module_name(path: Path) -> str:
    parts = path.relative_to(PACKAGE_ROOT.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def imported_modules(path: Path) -> set[str]:
    """Absolute names of the accord modules `path` imports (relative imports resolved)."""
    module = module_name(path)
    package = module.split(".") if path.name == "__init__.py" else module.split(".")[:-1]
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package[: len(package) - node.level + 1]
                found.add(".".join(base + ([node.module] if node.module else [])))
            elif node.module:
                found.add(node.module)
    return {name for name in found if name == "accord" or name.startswith("accord.")}


SOURCES = sorted(p for p in PACKAGE_ROOT.rglob("*.py") if len(p.relative_to(PACKAGE_ROOT).parts) > 1)


def test_every_package_is_in_the_rule_table() -> None:
    packages = {p.relative_to(PACKAGE_ROOT).parts[0] for p in SOURCES}
    assert packages <= ALLOWED.keys(), f"add {sorted(packages - ALLOWED.keys())} to ALLOWED"


def violations(own: str, imported: set[str]) -> list[str]:
    """The imports of a module of package `own` that break the rules."""
    broken = []
    for name in sorted(imported):
        # `accord` itself re-exports the offline API from core.
        target = name.split(".")[1] if "." in name else "core"
        if target == own:
            continue
        if target not in ALLOWED[own]:
            broken.append(f"{name} ({own} may import only {sorted(ALLOWED[own])})")
    return broken


@pytest.mark.parametrize("path", SOURCES, ids=lambda p: str(p.relative_to(PACKAGE_ROOT)))
def test_imports_follow_the_package_rules(path: Path) -> None:
    assert not violations(path.relative_to(PACKAGE_ROOT).parts[0], imported_modules(path))


def test_the_rules_catch_the_old_loop_and_a_concrete_backend_in_core() -> None:
    assert violations("conformance", {"accord.gate.deploy", "accord.server.app"})
    assert violations("server", {"accord.conformance.runner"})
    assert violations("core", {"accord.backends.cpu"})
    assert violations("core", {"accord.backends.base"})
    assert not violations("core", {"accord.op_contracts", "accord.core.device"})
    assert {"accord.conformance.runner", "accord.entrypoints"} <= imported_modules(PACKAGE_ROOT / "gate" / "deploy.py")
