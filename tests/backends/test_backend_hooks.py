"""The plugin surface is exactly what accord calls: every public member of Backend is
used outside the backend implementations, or listed in Backend.OPTIONAL_HOOKS with the
reason a plugin may still provide it."""

from __future__ import annotations

import re
from pathlib import Path

import accord
from accord.backends.base import Backend

PACKAGE = Path(accord.__file__).parent
#: Backend implementations (packages under accord/backends/): what they call on
#: themselves does not count as accord calling the hook.
IMPLEMENTATIONS = {path.parent for path in (PACKAGE / "backends").glob("*/__init__.py")}


def _callers_source() -> str:
    """Every accord module outside the backend implementations, definitions removed."""
    texts = []
    for path in PACKAGE.rglob("*.py"):
        if any(parent in IMPLEMENTATIONS for parent in path.parents):
            continue
        texts.append(re.sub(r"def \w+\(", "def (", path.read_text()))
    return "\n".join(texts)


def _public_members() -> list[str]:
    return [name for name in vars(Backend) if not name.startswith("_") and name != "OPTIONAL_HOOKS"]


def test_every_public_backend_member_is_called_or_documented_optional():
    source = _callers_source()
    unused = [name for name in _public_members() if not re.search(rf"\.{name}\b", source)]
    undocumented = [name for name in unused if name not in Backend.OPTIONAL_HOOKS]
    assert not undocumented, f"Backend members nothing calls and OPTIONAL_HOOKS does not explain: {undocumented}"


def test_optional_hooks_are_not_called_yet():
    """A hook core starts calling leaves the optional list (the list stays true)."""
    source = _callers_source()
    called = [name for name in Backend.OPTIONAL_HOOKS if re.search(rf"\.{name}\b", source)]
    assert not called, f"called by accord, so no longer optional: {called}"


def test_optional_hooks_are_real_members_with_reasons():
    for name, reason in Backend.OPTIONAL_HOOKS.items():
        assert name in _public_members() and reason
        member = vars(Backend)[name]
        if callable(member):
            assert (member.__doc__ or "").startswith("Optional:"), name


def test_prepare_fp8_weight_and_fp8_dtype_are_called_by_the_loader():
    loader = (PACKAGE / "core" / "models" / "weights.py").read_text()
    assert ".prepare_fp8_weight(" in loader and ".fp8_dtype()" in loader
