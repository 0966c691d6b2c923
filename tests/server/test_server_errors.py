"""Every malformed body and bad parameter gets its documented 4xx with an OpenAI error
body, and the server keeps serving."""

from __future__ import annotations

import httpx
import pytest

from server_harness import ServerProcess

COMPLETIONS, CHAT = "/v1/completions", "/v1/chat/completions"
HELLO = [{"role": "user", "content": "hi"}]
CHAT_HELLO = '{"messages": [{"role": "user", "content": "hi"}], '

#: (route, raw JSON body, status, the error's `param`)
BAD_REQUESTS = {
    "malformed JSON": (COMPLETIONS, '{"prompt": ', 400, None),
    "body is not an object": (COMPLETIONS, "[1, 2]", 400, None),
    "prompt missing": (COMPLETIONS, "{}", 400, "prompt"),
    "negative max_tokens": (COMPLETIONS, '{"prompt": "a", "max_tokens": -1}', 400, "max_tokens"),
    "max_tokens past the context": (COMPLETIONS, '{"prompt": "a", "max_tokens": 100000}', 400, "max_tokens"),
    "max_tokens of the wrong type": (COMPLETIONS, '{"prompt": "a", "max_tokens": "many"}', 400, "max_tokens"),
    "temperature of the wrong type": (COMPLETIONS, '{"prompt": "a", "temperature": "hot"}', 400, "temperature"),
    "negative temperature": (COMPLETIONS, '{"prompt": "a", "temperature": -1}', 400, "temperature"),
    "top_p of zero": (COMPLETIONS, '{"prompt": "a", "top_p": 0}', 400, "top_p"),
    "prompt longer than max-model-len": (COMPLETIONS, '{"prompt": [%s]}' % ", ".join(["65"] * 300), 400, "prompt"),
    "empty stop string": (COMPLETIONS, '{"prompt": "a", "stop": [""]}', 400, "stop"),
    "stop of the wrong type": (COMPLETIONS, '{"prompt": "a", "stop": 5}', 400, "stop"),
    "n below one": (COMPLETIONS, '{"prompt": "a", "n": 0}', 400, "n"),
    "unknown model": (COMPLETIONS, '{"prompt": "a", "model": "gpt-nothing"}', 404, "model"),
    "too many logprobs": (COMPLETIONS, '{"prompt": "a", "logprobs": 21}', 400, "logprobs"),
    "top_logprobs past --max-logprobs": (CHAT, CHAT_HELLO + '"logprobs": true, "top_logprobs": -1}', 400,
                                         "top_logprobs"),
    "token id outside the vocabulary": (COMPLETIONS, '{"prompt": [100000000]}', 400, "prompt"),
    "empty prompt list": (COMPLETIONS, '{"prompt": []}', 400, "prompt"),
    "no messages": (CHAT, '{"messages": []}', 400, "messages"),
    "role not a string": (CHAT, '{"messages": [{"role": 3, "content": "hi"}]}', 400, "messages"),
    "top_logprobs without logprobs": (CHAT, CHAT_HELLO + '"top_logprobs": 2}', 400, "top_logprobs"),
    "max_completion_tokens of zero": (CHAT, CHAT_HELLO + '"max_completion_tokens": 0}', 400, "max_completion_tokens"),
    "detokenize outside the vocabulary": ("/detokenize", '{"tokens": [-1]}', 400, "tokens"),
    "tokenize with nothing to tokenize": ("/tokenize", "{}", 400, "prompt"),
    "unknown route": ("/v1/nothing", "{}", 404, None),
}


@pytest.mark.parametrize("case", BAD_REQUESTS, ids=list(BAD_REQUESTS))
def test_bad_request_gets_its_status_and_an_openai_error_body(http: httpx.Client, case: str) -> None:
    route, body, status, param = BAD_REQUESTS[case]
    response = http.post(route, content=body, headers={"Content-Type": "application/json"})
    assert response.status_code == status, response.text
    error = response.json()["error"]
    assert set(error) == {"message", "type", "param", "code"} and error["message"]
    assert error["param"] == param
    # ... and the server still serves.
    assert http.post(COMPLETIONS, json={"prompt": "a", "max_tokens": 1}).status_code == 200


def test_missing_api_key_gets_401(server: ServerProcess) -> None:
    response = httpx.post(f"{server.url}{COMPLETIONS}", json={"prompt": "a", "max_tokens": 1})
    assert response.status_code == 401
    assert response.json()["error"]["code"] == "invalid_api_key"


def test_wrong_api_key_gets_401(server: ServerProcess) -> None:
    response = httpx.post(
        f"{server.url}{CHAT}", json={"messages": HELLO}, headers={"Authorization": "Bearer not-the-key"}
    )
    assert response.status_code == 401


def test_health_needs_no_api_key(server: ServerProcess) -> None:
    assert httpx.get(f"{server.url}/health").status_code == 200
