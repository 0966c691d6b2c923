"""The layering rules (RULES.md, DESIGN.md): op_contracts imports nothing of accord;
core and backends never import the server, CLI or gate; core never imports a backend
(the caller hands it one); a backend never imports core or the server.

Every import statement of every module counts, including those under TYPE_CHECKING
and inside functions: a rule a type hint may break is not a rule.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

SOURCE_ROOT = Path(__file__).resolve().parents[2]

#: (layer, packages it must not import, why)
RULES = (
    ("accord.op_contracts", ("accord",), "op_contracts imports nothing of accord"),
    ("accord.core", ("accord.server", "accord.conformance"), "core never imports the server, CLI or gate"),
    ("accord.core", ("accord.backends",), "core never imports a backend: the caller hands it one"),
    ("accord.backends", ("accord.core", "accord.server", "accord.conformance"), "a backend never imports core, the server or the gate"),
)


def module_name(path: Path, root: Path) -> str:
    parts = path.relative_to(root).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def imported_modules(path: Path, root: Path) -> list[str]:
    """Absolute names of every module `path` imports (relative imports resolved)."""
    name = module_name(path, root)
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    found = []
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            found += [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")[: len(package.split(".")) - node.level + 1]
                prefix = ".".join(base)
                target = f"{prefix}.{node.module}" if node.module else prefix
            else:
                target = node.module or ""
            found.append(target)
            # `from . import x` and `from accord import backends` name modules too.
            found += [f"{target}.{alias.name}" for alias in node.names]
    return found


def violations(layer: str, forbidden: tuple[str, ...], root: Path = SOURCE_ROOT) -> list[str]:
    """'module imports name' for each import in `layer` of a `forbidden` package."""
    own = layer + "."
    bad = []
    for path in sorted((root / "accord").rglob("*.py")):
        name = module_name(path, root)
        if name != layer and not name.startswith(own):
            continue
        for target in imported_modules(path, root):
            if target == layer or target.startswith(own):
                continue
            if any(target == f or target.startswith(f + ".") for f in forbidden):
                bad.append(f"{name} imports {target}")
    return bad


@pytest.mark.parametrize(("layer", "forbidden", "rule"), RULES, ids=[rule for _, _, rule in RULES])
def test_layers_import_only_what_they_may(layer: str, forbidden: tuple[str, ...], rule: str) -> None:
    assert violations(layer, forbidden) == [], rule


def test_the_checker_finds_planted_relative_and_absolute_imports(tmp_path: Path) -> None:
    """The checker itself can fail: planted imports in a copy of the layout are found."""
    core = tmp_path / "accord" / "core"
    core.mkdir(parents=True)
    (tmp_path / "accord" / "__init__.py").write_text("")
    (core / "__init__.py").write_text("from . import engine\n")
    (core / "engine.py").write_text("from ..backends import get_backend\nfrom .scheduler import Scheduler\n")
    (core / "runner.py").write_text("def f():\n    import accord.server.app\n")
    assert violations("accord.core", ("accord.backends",), tmp_path) == [
        "accord.core.engine imports accord.backends",
        "accord.core.engine imports accord.backends.get_backend",
    ]
    assert violations("accord.core", ("accord.server",), tmp_path) == ["accord.core.runner imports accord.server.app"]
    assert "accord.core.scheduler" in imported_modules(core / "engine.py", tmp_path)
