"""The import rules between accord's packages, read from the source (every import,
lazy ones inside functions included), so a loop between packages cannot come back:
op_contracts imports nothing of accord; backends only op_contracts; core only
op_contracts (never a backend, not even the plugin interface: the caller hands it
one, and the device facts it reads are the protocol in accord/core/device.py); conformance neither the gate, the server nor
the CLI; entrypoints (the public LLM/AsyncLLM with backends found by name) sit on core
and backends; bench (the benchmarks) sits on entrypoints and never touches the server,
nor the server it; the gate sits above conformance and server; only the CLI sees everything.
`from accord import LLM` counts as importing the module that defines the name (the
package's lazy table), not as core.

And no two accord modules import each other, directly or round a longer loop. The
cycle check counts the imports that run: module level and inside functions alike (a
loop through a lazy import is still two modules that each need the other), but not
those under `if TYPE_CHECKING:` (annotations only). `from package import submodule` is
an edge to the submodule, not to the package's `__init__`."""

from __future__ import annotations

import ast
import graphlib
from pathlib import Path

import pytest

from accord import _LAZY as ROOT_EXPORTS

PACKAGE_ROOT = Path(__file__).resolve().parents[1] / "accord"
#: The accord packages each package may import (besides itself).
ALLOWED: dict[str, set[str]] = {
    "op_contracts": set(),
    # _npu_autoload: a standard-library-only shim the Ascend backend installs before torch.
    "_npu_autoload": set(),
    # _openmp_wait: standard-library only too; the benchmarks take its peer environment.
    "_openmp_wait": set(),
    # client_disconnect: asyncio and the ASGI request only, for the server and the router.
    "client_disconnect": set(),
    "backends": {"op_contracts", "_npu_autoload"},
    "core": {"op_contracts"},
    # core: the collective conformance runs ranks on core's distributed setup.
    "conformance": {"op_contracts", "backends", "core"},
    "demo": set(),
    "entrypoints": {"op_contracts", "backends", "core", "demo"},
    "server": {"op_contracts", "core", "client_disconnect"},
    # Quality measurements drive the offline LLM through core's API.
    "eval": {"op_contracts", "core"},
    # The benchmarks run the offline LLM (entrypoints) and measure any OpenAI server over
    # HTTP: never the server's code, and the server never theirs.
    "bench": {"op_contracts", "backends", "core", "entrypoints", "demo", "_openmp_wait"},
    "gate": {"op_contracts", "backends", "core", "entrypoints", "conformance", "server"},
    # The router speaks HTTP to instances: nothing of the engine.
    "router": {"client_disconnect"},
    "cli": {"op_contracts", "backends", "core", "entrypoints", "conformance", "server", "gate", "demo", "bench",
            "router", "eval"},
}

def module_name(path: Path) -> str:
    parts = path.relative_to(PACKAGE_ROOT.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


#: Every accord module by dotted name.
MODULES = {module_name(p): p for p in sorted(PACKAGE_ROOT.rglob("*.py"))}


def _imports_that_run(tree: ast.Module) -> list[ast.Import | ast.ImportFrom]:
    """Every import statement of a module, lazy ones inside functions included, except
    those under `if TYPE_CHECKING:`."""
    found: list[ast.Import | ast.ImportFrom] = []

    def visit(node: ast.AST) -> None:
        if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test):
            for child in node.orelse:
                visit(child)
            return
        if isinstance(node, (ast.Import, ast.ImportFrom)):
            found.append(node)
        for child in ast.iter_child_nodes(node):
            visit(child)

    visit(tree)
    return found


def imported_modules(path: Path) -> set[str]:
    """Absolute names of the accord modules `path` imports (relative imports resolved;
    `from package import submodule` names the submodule; `from accord import LLM` the
    module that defines LLM)."""
    module = module_name(path)
    package = module.split(".") if path.name == "__init__.py" else module.split(".")[:-1]
    found = set()
    for node in _imports_that_run(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
            continue
        if node.level:
            base = ".".join(package[: len(package) - node.level + 1] + ([node.module] if node.module else []))
        elif node.module:
            base = node.module
        else:
            continue
        for alias in node.names:
            if base == "accord" and alias.name in ROOT_EXPORTS:
                found.add(ROOT_EXPORTS[alias.name])
            elif f"{base}.{alias.name}" in MODULES:
                found.add(f"{base}.{alias.name}")
            else:
                found.add(base)
    return {name for name in found if name == "accord" or name.startswith("accord.")}


SOURCES = sorted(p for p in PACKAGE_ROOT.rglob("*.py") if len(p.relative_to(PACKAGE_ROOT).parts) > 1)


def test_every_package_is_in_the_rule_table() -> None:
    packages = {p.relative_to(PACKAGE_ROOT).parts[0] for p in SOURCES}
    assert packages <= ALLOWED.keys(), f"add {sorted(packages - ALLOWED.keys())} to ALLOWED"


def violations(own: str, imported: set[str], extra: set[str] = frozenset()) -> list[str]:
    """The imports of a module of package `own` (allowed `extra` packages besides) that
    break the rules."""
    broken = []
    for name in sorted(imported):
        if name == "accord":
            continue  # the package root: its version and the npu guard, nothing else
        target = name.split(".")[1]
        if target == own:
            continue
        if target not in ALLOWED[own] | extra:
            broken.append(f"{name} ({own} may import only {sorted(ALLOWED[own])})")
    return broken


@pytest.mark.parametrize("path", SOURCES, ids=lambda p: str(p.relative_to(PACKAGE_ROOT)))
def test_imports_follow_the_package_rules(path: Path) -> None:
    relative = path.relative_to(PACKAGE_ROOT)
    assert not violations(relative.parts[0], imported_modules(path))


def test_the_rules_catch_the_old_loop_and_a_concrete_backend_in_core() -> None:
    assert violations("conformance", {"accord.gate.deploy", "accord.server.app"})
    assert violations("server", {"accord.conformance.runner"})
    assert violations("core", {"accord.backends.cpu"})
    assert violations("core", {"accord.backends.base"})
    assert violations("server", {"accord.bench.offline.command"})
    assert violations("bench", {"accord.server.app"})
    assert violations("server", {"accord.backends.cpu"})
    assert not violations("core", {"accord.op_contracts", "accord.core.device"})
    assert {"accord.conformance.runner", "accord.entrypoints"} <= imported_modules(PACKAGE_ROOT / "gate" / "deploy.py")


#: Inside core, a folder per role; the roles above may use those below, never the other
#: way: role -> the core folders it must not import. The step contract
#: (core.sched.output) is what the scheduler hands the workers, so everyone may read it.
CORE_ROLES_FORBIDDEN: dict[str, set[str]] = {
    "engine": set(),
    "sched": {"engine", "worker", "executor", "model_loader", "models"},
    "executor": {"engine", "sched"},
    "worker": {"engine", "sched", "executor"},
    # The graphs read the parsed config; reading a model from disk is the loader's, above them.
    "models": {"engine", "sched", "executor", "model_loader.load", "model_loader.source", "model_loader.gguf"},
    # The loader builds the graph it loads (load.py), so it sits above models.
    "model_loader": {"engine", "sched", "worker", "executor"},
    "structured_output": {"engine", "sched", "worker", "executor", "models"},
    "distributed": {"engine", "sched", "worker", "executor", "models", "model_loader"},
    # The proposers read token histories; the runner (worker) calls them.
    "spec_decode": {"engine", "sched", "worker", "executor", "model_loader"},
    # LoRA hooks the graphs' projections and reads adapters for the runner (worker), the
    # scheduler (its requests' adapters) and the engine (checks) above it.
    "lora": {"engine", "sched", "worker", "executor", "model_loader.load", "model_loader.source", "model_loader.gguf"},
    # Connectors see requests as plain data and caches as tensors: below the scheduler and the runner.
    "kv_transfer": {"engine", "sched", "worker", "executor", "model_loader", "models"},
}
#: What core keeps outside the role folders: data and settings every role shares.
CORE_SHARED_MODULES = {
    "__init__", "cache_affinity", "config", "device", "errors", "outputs", "quantization", "sampling_params", "stats",
    "thinking",
}
STEP_CONTRACT = "accord.core.sched.output"


def core_role_violations(role: str, imported: set[str]) -> list[str]:
    """The imports of a module in core's `role` folder that reach a role above it."""
    broken = []
    for name in sorted(imported):
        inner = name.removeprefix("accord.core.")
        if name == STEP_CONTRACT or not name.startswith("accord.core.") or inner.split(".")[0] == role:
            continue
        if any(inner == f or inner.startswith(f + ".") for f in CORE_ROLES_FORBIDDEN[role]):
            broken.append(f"{name} (core/{role} must not import {sorted(CORE_ROLES_FORBIDDEN[role])})")
    return broken


CORE = PACKAGE_ROOT / "core"
CORE_ROLE_SOURCES = sorted(p for p in CORE.rglob("*.py") if len(p.relative_to(CORE).parts) > 1)


def test_core_holds_role_folders_and_the_shared_modules_only() -> None:
    folders = {p.name for p in CORE.iterdir() if p.is_dir() and (p / "__init__.py").is_file()}
    assert folders == CORE_ROLES_FORBIDDEN.keys()
    assert {p.stem for p in CORE.glob("*.py")} == CORE_SHARED_MODULES


@pytest.mark.parametrize("path", CORE_ROLE_SOURCES, ids=lambda p: str(p.relative_to(CORE)))
def test_core_roles_import_only_downwards(path: Path) -> None:
    assert not core_role_violations(path.relative_to(CORE).parts[0], imported_modules(path))


def test_the_role_rules_catch_a_scheduler_reaching_up() -> None:
    assert core_role_violations("sched", {"accord.core.engine.output_processor"})
    assert core_role_violations("worker", {"accord.core.sched.scheduler"})
    assert not core_role_violations("worker", {STEP_CONTRACT, "accord.core.outputs"})


#: What the server may see of core: the shared data, structured output's request
#: parameters, a request's LoRA adapter, and the engine through the EngineClient
#: protocol, nothing below it.
SERVER_VIEW_OF_CORE = {f"accord.core.{name}" for name in CORE_SHARED_MODULES - {"__init__"}} | {
    "accord.core.engine.client",
    "accord.core.structured_output",
    "accord.core.lora.request",
}
SERVER_SOURCES = sorted((PACKAGE_ROOT / "server").rglob("*.py"))


def server_core_violations(imported: set[str]) -> list[str]:
    """The core modules a server module imports beyond what it may see."""
    return sorted(
        name
        for name in imported
        if name.startswith("accord.core.")
        and not any(name == seen or name.startswith(seen + ".") for seen in SERVER_VIEW_OF_CORE)
    )


@pytest.mark.parametrize("path", SERVER_SOURCES, ids=lambda p: str(p.relative_to(PACKAGE_ROOT)))
def test_the_server_sees_the_engine_through_engine_client_only(path: Path) -> None:
    assert not server_core_violations(imported_modules(path))


def test_the_server_rule_catches_a_reach_below_the_client() -> None:
    assert server_core_violations({"accord.core.engine.async_llm", "accord.core.sched.scheduler"})
    assert not server_core_violations({"accord.core.engine.client", "accord.core.outputs"})


#: Who may hold the scheduler's Request: the scheduler's own folder, and the engine
#: that builds one and hands it to Scheduler.add_request.
REQUEST_MODULE = "accord.core.sched.request"
REQUEST_HOLDERS = {"accord.core.engine.llm_engine"}


def test_only_the_scheduler_and_the_engine_that_builds_them_see_a_request() -> None:
    holders = {
        name
        for name, path in MODULES.items()
        if REQUEST_MODULE in imported_modules(path) and not name.startswith("accord.core.sched")
    }
    assert holders == REQUEST_HOLDERS


def import_cycle(graph: dict[str, set[str]]) -> list[str] | None:
    """One loop of modules that import each other round it, or None (graphlib's
    topological sort finds it)."""
    try:
        graphlib.TopologicalSorter(graph).prepare()
    except graphlib.CycleError as error:
        return error.args[1]
    return None


def test_no_two_modules_import_each_other() -> None:
    graph = {name: imported_modules(path) - {name} for name, path in MODULES.items()}
    cycle = import_cycle(graph)
    assert cycle is None, f"import cycle: {' -> '.join(cycle)}; move what both need into a module of its own"


def test_the_cycle_check_finds_a_loop_through_a_lazy_import(tmp_path: Path) -> None:
    assert import_cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}})
    assert import_cycle({"a": {"b"}, "b": set()}) is None
    lazy = tmp_path / "lazy.py"
    lazy.write_text("def f():\n    from accord.core import engine\n")
    annotations = tmp_path / "annotations.py"
    annotations.write_text("from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from accord.core import engine\n")
    assert [type(n).__name__ for n in _imports_that_run(ast.parse(lazy.read_text()))] == ["ImportFrom"]
    assert [n.module for n in _imports_that_run(ast.parse(annotations.read_text()))] == ["typing"]


def test_from_accord_import_counts_as_the_module_defining_the_name() -> None:
    assert violations("server", {ROOT_EXPORTS["LLM"]})
    assert not violations("server", {"accord"})
