"""Placing JSON schemas inside one larger schema (each tool's parameters under a
tool-call envelope) without breaking their references.

A schema's `$ref`s are relative to its own root: `#/$defs/WeatherOptions` (pydantic's
nested models), `#/definitions/...` (draft-07) or `#` (a recursive schema). Nested
under another document's `anyOf[i].properties.arguments` they point nowhere, so each
embedded schema's definitions move to the document's root `$defs` under a prefix of
its own (two tools may both define `Options`), its root becomes a definition too, and
every reference is rewritten to match.
"""

from __future__ import annotations

import copy
from collections.abc import Mapping
from typing import Any

#: Where draft 2019+ and draft-07 schemas keep their definitions.
_DEFINITION_KEYS = ("$defs", "definitions")


def _pointer_segment(name: str) -> str:
    # JSON pointer escaping (RFC 6901): "~" as "~0", "/" as "~1".
    return name.replace("~", "~0").replace("/", "~1")


def _unescape(segment: str) -> str:
    return segment.replace("~1", "/").replace("~0", "~")


def _rewrite_refs(node: Any, rewrite: Mapping[str, str], root_name: str) -> None:
    """Rewrite, in place, every local `$ref` under `node` to its hoisted place."""
    pending = [node]
    while pending:
        item = pending.pop()
        if isinstance(item, dict):
            ref = item.get("$ref")
            if isinstance(ref, str):
                item["$ref"] = _hoisted_ref(ref, rewrite, root_name)
            pending.extend(item.values())
        elif isinstance(item, list):
            pending.extend(item)


def _hoisted_ref(ref: str, rewrite: Mapping[str, str], root_name: str) -> str:
    if ref == "#":
        return f"#/$defs/{_pointer_segment(root_name)}"
    for key in _DEFINITION_KEYS:
        prefix = f"#/{key}/"
        if ref.startswith(prefix):
            first, _, rest = ref[len(prefix):].partition("/")
            name = rewrite.get(_unescape(first))
            if name is None:
                raise ValueError(f"the schema of {root_name!r} refers to {ref}, which it does not define")
            return f"#/$defs/{_pointer_segment(name)}" + (f"/{rest}" if rest else "")
    if ref.startswith("#"):
        # A pointer into the schema's own body (#/properties/x): relative to its hoisted root.
        return f"#/$defs/{_pointer_segment(root_name)}{ref[1:]}"
    return ref  # a remote reference: left for the compiler to refuse


def embed_schemas(schemas: Mapping[str, Mapping[str, Any]]) -> tuple[dict[str, dict[str, Any]], dict[str, Any]]:
    """Schemas by name, made ready to sit anywhere in one document: (per name, a
    `{"$ref": ...}` to put where the schema goes; the `$defs` the document's root must
    carry). The inputs are not changed."""
    placed: dict[str, dict[str, Any]] = {}
    definitions: dict[str, Any] = {}
    for name, schema in schemas.items():
        body = copy.deepcopy(dict(schema))
        local: dict[str, Any] = {}
        for key in _DEFINITION_KEYS:
            local.update(body.pop(key, None) or {})
        rewrite = {local_name: f"{name}.{local_name}" for local_name in local}
        for local_name, definition in local.items():
            _rewrite_refs(definition, rewrite, name)
            definitions[rewrite[local_name]] = definition
        _rewrite_refs(body, rewrite, name)
        definitions[name] = body
        placed[name] = {"$ref": f"#/$defs/{_pointer_segment(name)}"}
    return placed, definitions
