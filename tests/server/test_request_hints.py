"""The hints a request's headers add (accord/server/request_hints.py): the agent session
from X-Session-Id unless the body names one, the tenant from X-Tenant-Id or the API
key it presented (by its place, never its text), and tenant labels bounded in number."""

from __future__ import annotations

from accord.server.protocol import ChatCompletionRequest
from accord.server.metrics import OTHER_TENANT, TenantLabels
from accord.server.request_hints import apply_header_hints, tenant_from
from accord.server.responses.protocol import ResponsesRequest

KEYS = ("first-key", "second-key")


def test_the_tenant_is_the_x_tenant_id_header_else_the_place_of_the_api_key() -> None:
    assert tenant_from({"x-tenant-id": "acme", "authorization": "Bearer second-key"}, KEYS) == "acme"
    assert tenant_from({"authorization": "Bearer second-key"}, KEYS) == "key1"
    assert tenant_from({"authorization": "Bearer wrong"}, KEYS) is None
    assert tenant_from({"authorization": "Basic second-key"}, KEYS) is None
    assert tenant_from({}, ()) is None


def test_tenant_labels_past_the_bound_are_other() -> None:
    labels = TenantLabels(limit=2)
    assert [labels.label(t) for t in ("a", "b", "c", "a", "d", "b")] == ["a", "b", OTHER_TENANT, "a", OTHER_TENANT, "b"]


def test_the_session_header_fills_in_only_a_missing_body_session_id() -> None:
    headers = {"x-session-id": "from-header", "x-tenant-id": "acme"}
    unnamed = ChatCompletionRequest(messages=[{"role": "user", "content": "hi"}])
    named = ChatCompletionRequest(messages=[{"role": "user", "content": "hi"}], session_id="from-body")
    for request in (unnamed, named):
        apply_header_hints(request, headers, ())
    assert (unnamed.session_id, named.session_id) == ("from-header", "from-body")
    assert unnamed._tenant == named._tenant == "acme"


def test_a_responses_requests_session_is_its_prompt_cache_key() -> None:
    request = ResponsesRequest(model="m", input="hi")
    apply_header_hints(request, {"x-session-id": "s1"}, ())
    assert request.prompt_cache_key == "s1" and request._tenant is None
