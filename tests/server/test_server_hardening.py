"""Issue 13's findings, each as the request that showed it (on the shared demo-model
server): one bad request never fails its batch mates, auth comes first, lone
surrogates, silently ignored fields, and the smaller protocol gaps."""

from __future__ import annotations

import json
import socket
import subprocess
import sys
import threading

import httpx
import pytest
from server_harness import API_KEY, ServerProcess
from accord.demo.model import DEMO_MODEL_NAME

COMPLETIONS, CHAT = "/v1/completions", "/v1/chat/completions"
MODEL = DEMO_MODEL_NAME


def post_raw(http: httpx.Client, route: str, body: str) -> httpx.Response:
    return http.post(route, content=body, headers={"Content-Type": "application/json"})


# -- finding 1: a bad request is refused up front and fails nobody else ---------------
KERNEL_BREAKERS = {
    "top_k past int32": {"prompt": "x", "max_tokens": 2, "top_k": 2147483648},
    "stop id past the vocabulary": {"prompt": "x", "max_tokens": 4, "min_tokens": 1, "stop_token_ids": [5000]},
    "boolean stop id": {"prompt": "x", "max_tokens": 4, "stop_token_ids": [True]},
    "negative stop id": {"prompt": "x", "max_tokens": 4, "stop_token_ids": [-1]},
    "boolean prompt id": {"prompt": [True, 5], "max_tokens": 2},
    "seed past int64": {"prompt": "x", "max_tokens": 2, "seed": 2**64},
    "logit_bias id past the vocabulary": {"prompt": "x", "max_tokens": 2, "logit_bias": {"5000": 1}},
    "logit_bias past 100": {"prompt": "x", "max_tokens": 2, "logit_bias": {"5": 100.5}},
}


def test_requests_that_broke_kernels_get_400_and_streams_in_flight_finish(http: httpx.Client) -> None:
    body = {"prompt": "A long story:", "max_tokens": 40, "ignore_eos": True, "stream": True}
    with http.stream("POST", COMPLETIONS, json=body) as stream:
        lines = stream.iter_lines()
        assert next(lines).startswith("data: ")
        for case, bad in KERNEL_BREAKERS.items():
            response = http.post(COMPLETIONS, json=bad)
            assert response.status_code == 400, (case, response.text)
            assert response.json()["error"]["param"] in {"top_k", "stop_token_ids", "prompt", "seed", "logit_bias"}
        events = [line.removeprefix("data: ") for line in lines if line]
    assert events[-1] == "[DONE]"
    assert json.loads(events[-2])["choices"][0]["finish_reason"] == "length"


# -- finding 3: the key guards the tokenizer routes and comes before validation --------
@pytest.mark.parametrize(
    ("route", "body"),
    [("/tokenize", '{"prompt": "hi"}'), ("/detokenize", '{"tokens": [1]}'), (COMPLETIONS, '{"prompt": '),
     (COMPLETIONS, '{"max_tokens": "many"}'), ("/v1/models", None)],
)
def test_without_the_key_every_protected_route_gets_401_whatever_the_body(
    server: ServerProcess, route: str, body: str | None
) -> None:
    if body is None:
        response = httpx.get(f"{server.url}{route}")
    else:
        response = httpx.post(f"{server.url}{route}", content=body, headers={"Content-Type": "application/json"})
    assert response.status_code == 401, response.text
    assert response.json()["error"]["code"] == "invalid_api_key"


def test_health_and_metrics_stay_open_without_the_key(server: ServerProcess) -> None:
    assert httpx.get(f"{server.url}/health").json() == {"status": "ok"}
    assert httpx.get(f"{server.url}/metrics").status_code == 200


# -- finding 5: lone surrogates are a client error -------------------------------------
@pytest.mark.parametrize(
    ("route", "body", "param"),
    [
        (COMPLETIONS, '{"prompt": "a\\ud800b", "max_tokens": 2}', "prompt"),
        (COMPLETIONS, '{"prompt": ["ok", "a\\udfffb"], "max_tokens": 2}', "prompt"),
        (CHAT, '{"messages": [{"role": "user", "content": "a\\ud800b"}]}', "messages"),
        (CHAT, '{"messages": [{"role": "user", "content": [{"type": "text", "text": "\\ud800"}]}]}', "messages"),
        (COMPLETIONS, '{"prompt": "a", "stop": ["\\ud800"]}', "stop"),
        ("/tokenize", '{"prompt": "a\\ud800b"}', "prompt"),
    ],
)
def test_lone_surrogates_get_400(http: httpx.Client, route: str, body: str, param: str) -> None:
    response = post_raw(http, route, body)
    assert response.status_code == 400, response.text
    assert response.json()["error"]["param"] == param
    assert "surrogate" in response.json()["error"]["message"]


LONE = "\ud800"  # json.dumps writes it as the escape a client sends: "\\ud800"


def _chat(call: dict | None = None, tool: dict | None = None, user: dict | None = None,
          function: dict | None = None) -> dict:
    """A conversation (user, assistant tool call, tool result) and a tool, each part
    with the given fields replaced."""
    call = {"id": "call_1", "type": "function", "function": {"name": "f", "arguments": '{"x": 1}'}, **(call or {})}
    messages = [
        {"role": "user", "content": "hi", **(user or {})},
        {"role": "assistant", "content": None, "tool_calls": [call]},
        {"role": "tool", "content": "42", "tool_call_id": "call_1", **(tool or {})},
    ]
    tools = [{"type": "function", "function": {"name": "f", **(function or {})}}]
    return {"messages": messages, "tools": tools, "max_tokens": 2}


#: Every string of a conversation or tool list that reaches the chat template, as a
#: request with a lone surrogate there, and where the error must say it is.
TEMPLATE_STRINGS = {
    "function name": (lambda t: _chat(call={"function": {"name": t, "arguments": "{}"}}),
                      "messages.1.tool_calls.0.function.name"),
    "function arguments": (lambda t: _chat(call={"function": {"name": "f", "arguments": f'{{"x": "{t}"}}'}}),
                           "messages.1.tool_calls.0.function.arguments"),
    "tool call id": (lambda t: _chat(call={"id": t}), "messages.1.tool_calls.0.id"),
    "tool result's call id": (lambda t: _chat(tool={"tool_call_id": t}), "messages.2.tool_call_id"),
    "message name": (lambda t: _chat(user={"name": t}), "messages.0.name"),
    "tool description": (lambda t: _chat(function={"description": t}), "tools.0.function.description"),
    "parameter schema": (
        lambda t: _chat(function={"parameters": {"type": "object", "properties": {"x": {"description": t}}}}),
        "tools.0.function.parameters",
    ),
    "parameter schema key": (
        lambda t: _chat(function={"parameters": {"type": "object", "properties": {t: {"type": "string"}}}}),
        "tools.0.function.parameters",
    ),
}


@pytest.mark.parametrize(("request_with", "field"), TEMPLATE_STRINGS.values(), ids=TEMPLATE_STRINGS)
def test_a_lone_surrogate_in_any_string_the_template_reads_gets_400_naming_the_field(
    http: httpx.Client, request_with, field: str
) -> None:
    response = post_raw(http, CHAT, json.dumps(request_with(LONE)))
    assert response.status_code == 400, response.text
    error = response.json()["error"]
    assert error["param"] == field.split(".")[0] and field in error["message"] and "surrogate" in error["message"]


@pytest.mark.parametrize("request_with", [case for case, _ in TEMPLATE_STRINGS.values()], ids=TEMPLATE_STRINGS)
def test_the_same_requests_with_valid_text_are_served(http: httpx.Client, request_with) -> None:
    # The 400 above is for the surrogate alone.
    response = post_raw(http, CHAT, json.dumps(request_with("x")))
    assert response.status_code == 200, response.text


# -- finding 6: fields accord does not implement are refused, never ignored ------------
@pytest.mark.parametrize(
    ("route", "field", "value"),
    [
        (COMPLETIONS, "suffix", "tail"),
        (COMPLETIONS, "best_of", 2),
        (CHAT, "functions", [{"name": "f", "parameters": {}}]),
        (CHAT, "modalities", ["text", "audio"]),
        (COMPLETIONS, "stream_options", {"include_usage": True}),
        (CHAT, "stream_options", {"include_usage": True}),
    ],
)
def test_unimplemented_fields_get_400_naming_the_field(http: httpx.Client, route: str, field: str, value) -> None:
    base = {"prompt": "a"} if route == COMPLETIONS else {"messages": [{"role": "user", "content": "hi"}]}
    response = http.post(route, json={**base, "max_tokens": 2, field: value})
    assert response.status_code == 400, response.text
    assert response.json()["error"]["param"] == field and field in response.json()["error"]["message"]


def test_stop_lists_are_capped(http: httpx.Client) -> None:
    response = http.post(COMPLETIONS, json={"prompt": "a", "max_tokens": 2, "stop": [f"s{i}" for i in range(65)]})
    assert response.status_code == 400 and response.json()["error"]["param"] == "stop"
    assert http.post(COMPLETIONS, json={"prompt": "a", "max_tokens": 2, "stop": [f"s{i}" for i in range(64)]}).is_success


# -- finding 2: bodies are capped ------------------------------------------------------
def test_a_body_past_the_cap_gets_413(http: httpx.Client) -> None:
    response = http.post(COMPLETIONS, content=b'{"prompt": "' + b"a" * (17 << 20) + b'"}',
                         headers={"Content-Type": "application/json"})
    assert response.status_code == 413
    assert response.json()["error"]["code"] == "request_too_large"


def test_a_chunked_body_past_the_cap_gets_413(http: httpx.Client) -> None:
    def chunks():
        yield b'{"prompt": "'
        for _ in range(17):
            yield b"a" * (1 << 20)
        yield b'"}'

    response = http.post(COMPLETIONS, content=chunks(), headers={"Content-Type": "application/json"})
    assert response.status_code == 413


# -- finding 9: the smaller ones --------------------------------------------------------
def test_an_unknown_model_is_404_model_not_found(http: httpx.Client) -> None:
    for response in (
        http.post(COMPLETIONS, json={"prompt": "a", "model": "gpt-nothing"}),
        http.get("/v1/models/gpt-nothing"),
    ):
        assert response.status_code == 404
        assert response.json()["error"]["code"] == "model_not_found"


def test_a_model_can_be_read_by_id_and_exposes_no_local_path(http: httpx.Client) -> None:
    card = http.get(f"/v1/models/{MODEL}").json()
    assert card["id"] == MODEL and card["object"] == "model"
    listing = http.get("/v1/models").text
    assert "/" not in json.loads(listing)["data"][0]["root"] and "accord-cache" not in listing


def test_a_wrong_method_is_405_with_allow(http: httpx.Client) -> None:
    response = http.get(COMPLETIONS)
    assert response.status_code == 405
    assert response.headers["allow"] == "POST"
    assert response.json()["error"]["message"]


def test_priority_is_refused_under_fcfs(http: httpx.Client) -> None:
    response = http.post(COMPLETIONS, json={"prompt": "a", "max_tokens": 2, "priority": 5})
    assert response.status_code == 400 and response.json()["error"]["param"] == "priority"


def test_openapi_documents_400_not_422_and_the_event_stream(http: httpx.Client) -> None:
    schema = http.get("/openapi.json").json()
    for path in schema["paths"].values():
        for operation in path.values():
            assert "422" not in operation["responses"]
    completions = schema["paths"][COMPLETIONS]["post"]["responses"]
    assert "400" in completions and "text/event-stream" in completions["200"]["content"]


def test_logprobs_offsets_and_bytes_are_right_for_partial_characters(http: httpx.Client) -> None:
    # "aéb" is BOS, a, 0xC3, 0xA9, b in the demo tokenizer: é spans two tokens.
    body = {"prompt": "aéb", "echo": True, "max_tokens": 0, "logprobs": 0}
    choice = http.post(COMPLETIONS, json=body).json()["choices"][0]
    assert choice["text"] == "aéb"
    assert choice["logprobs"]["text_offset"] == [0, 0, 1, 1, 2]
    as_ids = http.post(COMPLETIONS, json={**body, "return_tokens_as_token_ids": True}).json()["choices"][0]
    assert as_ids["logprobs"]["text_offset"] == [0, 0, 1, 1, 2]  # not the lengths of "token_id:N"
    assert as_ids["logprobs"]["tokens"] == ["token_id:859", "token_id:97", "token_id:195", "token_id:169", "token_id:98"]
    # Chat: force the first byte of é and read its bytes back.
    chat = {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 1, "temperature": 0,
            "logit_bias": {"195": 100}, "logprobs": True}
    for extra in ({}, {"return_tokens_as_token_ids": True}):
        entry = http.post(CHAT, json={**chat, **extra}).json()["choices"][0]["logprobs"]["content"][0]
        assert entry["bytes"] == [0xC3]


@pytest.mark.slow
def test_serve_on_a_port_in_use_fails_before_claiming_to_serve(server: ServerProcess) -> None:
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = busy.getsockname()[1]
        result = subprocess.run(
            [sys.executable, "-m", "accord", "serve", "--port", str(port), "--model", DEMO_MODEL_NAME],
            capture_output=True, text=True, timeout=120,
        )
    assert result.returncode == 1
    assert "cannot listen" in result.stderr and "serving" not in result.stderr


# -- finding 4: a disconnect is quiet --------------------------------------------------
def test_a_disconnected_whole_request_logs_no_traceback(server: ServerProcess, http: httpx.Client) -> None:
    with pytest.raises(httpx.ReadTimeout):
        http.post(COMPLETIONS, json={"prompt": "x", "max_tokens": 200, "ignore_eos": True}, timeout=0.3)
    # The next request is served after the abort, so the log has caught up.
    assert http.post(COMPLETIONS, json={"prompt": "x", "max_tokens": 1}).is_success
    log = server.output()
    assert "Traceback" not in log and "499 is not a valid HTTPStatus" not in log


def test_concurrent_bad_and_good_requests_never_cross(http: httpx.Client) -> None:
    results: dict[str, int] = {}

    def run(name: str, body: dict) -> None:
        results[name] = http.post(COMPLETIONS, json=body).status_code

    threads = [threading.Thread(target=run, args=(f"good{i}", {"prompt": "x", "max_tokens": 8})) for i in range(4)]
    threads += [threading.Thread(target=run, args=(case, body)) for case, body in KERNEL_BREAKERS.items()]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert all(results[f"good{i}"] == 200 for i in range(4))
    assert all(results[case] == 400 for case in KERNEL_BREAKERS)


assert API_KEY  # the shared server requires it: these tests use the keyed `http` client
