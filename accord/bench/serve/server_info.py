"""What the server says of itself, recorded with every result: its version (`GET
/version`, vLLM's), the models it serves with their cards (`GET /v1/models`: accord's
and vLLM's carry max_model_len), and the prefix cache's state (reset through `POST
/reset_prefix_cache` where the server offers it, as vLLM does)."""

from __future__ import annotations

from typing import Any

from .http_session import HttpSession


async def server_info(http: HttpSession, base_url: str) -> dict[str, Any]:
    """The server's `/version` and `/v1/models` answers, as given (an absent route
    answers {"error": ...}: a fact to record)."""
    return {"version": await http.get_json(f"{base_url}/version"), "models": await http.get_json(f"{base_url}/v1/models")}


def first_model(info: dict[str, Any]) -> str | None:
    """The id of the first model `/v1/models` lists (vLLM's default for --model), or None."""
    models = info.get("models")
    data = models.get("data") if isinstance(models, dict) else None
    return data[0]["id"] if data else None


async def reset_prefix_cache(http: HttpSession, base_url: str) -> str:
    """Ask the server to empty its prefix cache; the state to record: "reset" when it
    did, else why it is unknown (the route absent, say, or vLLM's `{"success": false}`
    while blocks are still held)."""
    answer = await http.post_json(f"{base_url}/reset_prefix_cache")
    if not isinstance(answer, dict) or "error" in answer:
        why = answer.get("error") if isinstance(answer, dict) else f"unexpected JSON {answer!r:.80}"
        return f"not reset: POST /reset_prefix_cache answered {why} (state as the earlier requests left it)"
    if answer.get("success") is False:
        return "not reset: POST /reset_prefix_cache answered success=false (blocks still held; state as the earlier requests left it)"
    return "reset"
