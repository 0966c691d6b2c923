"""The Responses API (`/v1/responses`), served by the chat machinery: a request's
input items become chat messages, its output comes back as items and stream events."""

from __future__ import annotations

from .service import ResponsesService
from .store import ResponseStore

__all__ = ["ResponseStore", "ResponsesService"]
