"""What the server says of itself, recorded with every result: its version (`GET
/version`, vLLM's), the models it serves with their cards (`GET /v1/models`: accord's
and vLLM's carry max_model_len), and the prefix cache's state (reset through `POST
/reset_prefix_cache` where the server offers it, as vLLM does)."""

from __future__ import annotations

from typing import Any

import httpx


async def _get_json(http: httpx.AsyncClient, url: str) -> Any:
    """The JSON `url` answers, or {"error": why} (an absent route is a fact to record)."""
    try:
        response = await http.get(url)
    except httpx.HTTPError as error:
        return {"error": f"{type(error).__name__}: {error}"}
    if response.status_code != 200:
        return {"error": f"HTTP {response.status_code}"}
    try:
        return response.json()
    except ValueError:
        return {"error": "not JSON", "text": response.text[:200]}


async def server_info(http: httpx.AsyncClient, base_url: str) -> dict[str, Any]:
    """The server's `/version` and `/v1/models` answers, as given."""
    return {"version": await _get_json(http, f"{base_url}/version"), "models": await _get_json(http, f"{base_url}/v1/models")}


def first_model(info: dict[str, Any]) -> str | None:
    """The id of the first model `/v1/models` lists (vLLM's default for --model), or None."""
    models = info.get("models")
    data = models.get("data") if isinstance(models, dict) else None
    return data[0]["id"] if data else None


async def reset_prefix_cache(http: httpx.AsyncClient, base_url: str) -> str:
    """Ask the server to empty its prefix cache; the state to record: "reset" when it
    did, else why it is unknown (the route absent, say)."""
    try:
        response = await http.post(f"{base_url}/reset_prefix_cache")
    except httpx.HTTPError as error:
        return f"not reset: POST /reset_prefix_cache failed ({type(error).__name__}: {error})"
    if response.status_code == 200:
        return "reset"
    return f"not reset: POST /reset_prefix_cache answered HTTP {response.status_code} (state as the earlier requests left it)"
