"""Typing a tool argument that a format writes as bare text (Qwen3's XML
`<parameter=city>Dallas</parameter>`) by the tool's JSON schema, by the rules vLLM
applies: the schema's types (from `type`, `enum` values and `anyOf`/`oneOf`/`allOf`,
its local `$ref`s followed) are tried null, integer, number, boolean, object, array,
string, and the first that reads the text wins; text no type reads stays a string."""

from __future__ import annotations

import json
import math
from typing import Any

_PRIORITY = ("null", "integer", "number", "boolean", "object", "array", "string")
#: Type names models and hand-written schemas use for JSON Schema's own (vLLM reads them too).
_ALIASES = {
    "str": "string", "text": "string", "int": "integer", "long": "integer", "float": "number",
    "double": "number", "bool": "boolean", "dict": "object", "list": "array",
}
_ENUM_TYPES = ((bool, "boolean"), (int, "integer"), (float, "number"), (str, "string"), (list, "array"),
               (dict, "object"))


def _resolve(schema: Any, root: dict[str, Any]) -> Any:
    """`schema`, or what its local `$ref` (`#/$defs/Name`, `#/definitions/Name`) points at."""
    seen = set()
    while isinstance(schema, dict) and isinstance(schema.get("$ref"), str) and schema["$ref"] not in seen:
        seen.add(schema["$ref"])
        target: Any = root
        for segment in schema["$ref"].removeprefix("#").split("/")[1:]:
            target = target.get(segment.replace("~1", "/").replace("~0", "~")) if isinstance(target, dict) else None
        schema = target
    return schema


def schema_types(schema: Any, root: dict[str, Any]) -> set[str]:
    """The JSON types `schema` (inside the document `root`) allows; {"string"} when it says none."""
    schema = _resolve(schema, root)
    if not isinstance(schema, dict):
        return {"string"}
    types: set[str] = set()
    declared = schema.get("type")
    for name in [declared] if isinstance(declared, str) else declared if isinstance(declared, list) else []:
        if isinstance(name, str):
            types.add(_ALIASES.get(name.strip().lower(), name.strip().lower()))
    for value in schema.get("enum") or []:
        types.add("null" if value is None else next(name for kind, name in _ENUM_TYPES if isinstance(value, kind)))
    for key in ("anyOf", "oneOf", "allOf"):
        for choice in schema.get(key) or []:
            types |= schema_types(choice, root)
    return types or {"string"}


def string_choices(schema: Any, root: dict[str, Any]) -> list[str] | None:
    """The values of a `schema` that is an enum (or const) of strings only, else None."""
    schema = _resolve(schema, root)
    if not isinstance(schema, dict):
        return None
    values = schema.get("enum", [schema["const"]] if "const" in schema else None)
    if not values or not all(isinstance(value, str) for value in values):
        return None
    return list(values)


def _finite(value: Any) -> bool:
    # JSON has no inf or nan: text that reads as one keeps its type's turn from winning.
    if isinstance(value, float):
        return math.isfinite(value)
    if isinstance(value, list):
        return all(map(_finite, value))
    if isinstance(value, dict):
        return all(map(_finite, value.values()))
    return True


def _read_number(text: str) -> tuple[bool, Any]:
    try:
        return True, int(text)
    except ValueError:
        number = float(text)  # a ValueError here is the caller's "not a number"
    if not math.isfinite(number):
        return False, None
    return True, int(number) if number == int(number) else number


def _read(text: str, kind: str) -> tuple[bool, Any]:
    """Whether `text` reads as a value of JSON type `kind`, and the value."""
    if kind == "null":
        return text.lower() == "null", None
    if kind == "string":
        return True, text
    if kind == "boolean":
        word = text.strip().lower()
        return (True, word in ("true", "1")) if word in ("true", "1", "false", "0") else (False, None)
    try:
        if kind == "integer":
            return True, int(text)
        if kind == "number":
            return _read_number(text)
        value = json.loads(text)
    except (ValueError, OverflowError):
        return False, None
    wanted = dict if kind == "object" else list
    return isinstance(value, wanted) and _finite(value), value


def typed_value(text: str, schema: Any, root: dict[str, Any]) -> Any:
    """`text` as the value `schema` asks for (see the module's rules)."""
    types = schema_types(schema, root)
    for kind in _PRIORITY:
        if kind in types:
            ok, value = _read(text, kind)
            if ok:
                return value
    try:
        value = json.loads(text)
    except ValueError:
        return text
    return value if _finite(value) else text
