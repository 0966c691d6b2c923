"""The non-generation endpoints: tokenize, detokenize, health, version and the OpenAPI schema."""

from __future__ import annotations

from importlib.metadata import version

import httpx


def test_tokenize_then_detokenize_round_trips_a_prompt(http: httpx.Client) -> None:
    tokens = http.post("/tokenize", json={"prompt": "Hello, world!"}).json()["tokens"]
    text = http.post("/detokenize", json={"tokens": tokens}).json()["prompt"]
    assert text == "<|begin_of_text|>Hello, world!"


def test_tokenize_reports_count_and_context_length(http: httpx.Client) -> None:
    body = http.post("/tokenize", json={"prompt": "Hello", "add_special_tokens": False}).json()
    assert body["count"] == len(body["tokens"]) and body["max_model_len"] == 256


def test_tokenize_renders_chat_messages_with_the_template(http: httpx.Client) -> None:
    tokens = http.post("/tokenize", json={"messages": [{"role": "user", "content": "hi"}]}).json()["tokens"]
    text = http.post("/detokenize", json={"tokens": tokens}).json()["prompt"]
    assert text.endswith("<|start_header_id|>assistant<|end_header_id|>\n\n")


def test_openapi_schema_lists_every_route(http: httpx.Client) -> None:
    paths = http.get("/openapi.json").json()["paths"]
    routes = {"/v1/completions", "/v1/chat/completions", "/v1/models", "/tokenize", "/detokenize", "/health", "/metrics", "/version"}
    assert routes <= set(paths)


def test_version_answers_as_vllm_does_with_the_installed_package_version(http: httpx.Client) -> None:
    assert http.get("/version").json() == {"version": version("accord")}
