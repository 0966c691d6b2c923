"""What a request asks its output to match (vLLM's `StructuredOutputsParams`)."""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

#: JSON with no free whitespace: a grammar that allowed it would let a model pad
#: forever between tokens, and compact JSON parses the same.
COMPACT_JSON = {"whitespace_flexible": False}


@dataclass(frozen=True)
class StructuredOutputsParams:
    """Exactly one constraint: `json` (a JSON schema, as a dict or a JSON string),
    `json_object` (any JSON object), `regex`, `choice` (one of these strings) or
    `grammar` (Lark, as llguidance reads it, or GBNF)."""

    json: dict[str, Any] | str | None = None
    json_object: bool = False
    regex: str | None = None
    choice: tuple[str, ...] | None = None
    grammar: str | None = None

    def __post_init__(self) -> None:
        given = [name for name in ("json", "regex", "choice", "grammar") if getattr(self, name) is not None]
        given += ["json_object"] if self.json_object else []
        if len(given) != 1:
            raise ValueError(
                f"structured outputs take exactly one of json, json_object, regex, choice and grammar; got "
                f"{', '.join(given) or 'none'}."
            )
        if self.choice is not None:
            if not self.choice or not all(isinstance(c, str) and c for c in self.choice):
                raise ValueError("choice must be a non-empty list of non-empty strings.")
            object.__setattr__(self, "choice", tuple(self.choice))

    def schema(self) -> dict[str, Any]:
        """The JSON schema of a `json` or `json_object` constraint."""
        if self.json_object:
            return {"type": "object"}
        if isinstance(self.json, str):
            try:
                schema = json.loads(self.json)
            except json.JSONDecodeError as error:
                raise ValueError(f"the JSON schema is not valid JSON: {error}") from None
        else:
            schema = self.json
        if not isinstance(schema, dict):
            raise ValueError("a JSON schema must be a JSON object.")
        return schema
