"""A prompt's prefix-cache affinity hints, read from the prompt dict beside its tokens:
`cache_salt` (vLLM's TokensPrompt field: it salts the block hashes, so only requests
with the same salt share cached blocks) and `session_id` (the agent session the request
is a turn of: its blocks are kept over one-off requests' when the cache is tight, and a
router may send a session's turns to one instance)."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class CacheAffinity:
    """A request's cache salt and agent session (None: unsalted, in no session)."""

    cache_salt: str | None = None
    session_id: str | None = None

    @classmethod
    def of(cls, prompt: str | Mapping[str, Any]) -> CacheAffinity:
        """The hints of `prompt` (a text prompt has none); ValueError for one that is
        not a non-empty string."""
        if isinstance(prompt, str):
            return cls()
        hints = {}
        for name in ("cache_salt", "session_id"):
            value = prompt.get(name)
            if value is not None and (not isinstance(value, str) or not value):
                raise ValueError(f"{name} must be a non-empty string, got {value!r}")
            hints[name] = value
        return cls(**hints)

    def prompt_fields(self) -> dict[str, str]:
        """The hints as prompt dict fields (none for those unset)."""
        return {name: value for name, value in (("cache_salt", self.cache_salt), ("session_id", self.session_id))
                if value is not None}
