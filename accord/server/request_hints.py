"""What a request's headers add to its body: the agent session (`X-Session-Id`, as the
router reads it, when the body sets no `session_id`) and the tenant its usage is
counted under in /metrics (`X-Tenant-Id`; without it, on a server with --api-key, the
key it authenticated with, named by its place in the list, never by its text).

A header is the client's word, so /metrics labels only the first tenants it sees
(metrics.TenantLabels)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from .auth import key_index
from .protocol import SamplingFields
from .responses.protocol import ResponsesRequest

SESSION_HEADER = "x-session-id"
TENANT_HEADER = "x-tenant-id"


def session_from(body_session_id: str | None, headers: Mapping[str, str]) -> str | None:
    """The request's agent session: the body's `session_id`, else the X-Session-Id header."""
    return body_session_id or headers.get(SESSION_HEADER) or None


def tenant_from(headers: Mapping[str, str], api_keys: Sequence[str]) -> str | None:
    """The tenant a request's usage counts under: its X-Tenant-Id header, else
    "key<i>" for the i-th --api-key it presented, else None."""
    tenant = headers.get(TENANT_HEADER)
    if tenant:
        return tenant
    index = key_index(headers.get("authorization", ""), api_keys)
    return None if index is None else f"key{index}"


def apply_header_hints(
    request: SamplingFields | ResponsesRequest, headers: Mapping[str, str], api_keys: Sequence[str]
) -> None:
    """Set the agent session (a Responses request's is its prompt_cache_key) and the
    tenant that `request`'s headers name."""
    if isinstance(request, SamplingFields):
        request.session_id = session_from(request.session_id, headers)
    else:
        request.prompt_cache_key = session_from(request.prompt_cache_key, headers)
    request._tenant = tenant_from(headers, api_keys)
