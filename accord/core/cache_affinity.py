"""A prompt's prefix-cache affinity hints, read from the prompt dict beside its tokens:
`cache_salt` (vLLM's TokensPrompt field: it salts the block hashes, so only requests
with the same salt share cached blocks) and `session_id` (the agent session the request
is a turn of: its blocks are kept over one-off requests' when the cache is tight, and a
router may send a session's turns to one instance); beside them `tenant`, whom the
request is served for (the scheduler caps a tenant's concurrent thinking tokens)."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

#: The prompt dict fields these hints are read from.
_FIELDS = ("cache_salt", "session_id", "tenant")


@dataclass(frozen=True)
class CacheAffinity:
    """A request's cache salt, agent session and tenant (None: unsalted, in no
    session, of no tenant)."""

    cache_salt: str | None = None
    session_id: str | None = None
    tenant: str | None = None

    @classmethod
    def of(cls, prompt: str | Mapping[str, Any]) -> CacheAffinity:
        """The hints of `prompt` (a text prompt has none); ValueError for one that is
        not a non-empty string."""
        if isinstance(prompt, str):
            return cls()
        hints = {}
        for name in _FIELDS:
            value = prompt.get(name)
            if value is not None and (not isinstance(value, str) or not value):
                raise ValueError(f"{name} must be a non-empty string, got {value!r}")
            hints[name] = value
        return cls(**hints)

    def prompt_fields(self) -> dict[str, str]:
        """The hints as prompt dict fields (none for those unset)."""
        return {name: value for name in _FIELDS if (value := getattr(self, name)) is not None}
