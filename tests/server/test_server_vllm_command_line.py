"""A `vllm serve` command line from vLLM's tool-calling docs starts `accord serve`
unchanged (`--enable-auto-tool-choice --tool-call-parser hermes --max-model-len ...
--enable-prefix-caching --max-num-seqs ... -tp 2`, two ranks on the CPU), and vLLM's
server flags take their effect: --root-path, several --served-model-name values,
--max-logprobs -1, --enable-prompt-tokens-details, --enable-force-include-usage,
--return-tokens-as-token-ids, a tuning flag's note."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import httpx
import openai
import pytest
from server_harness import ServerProcess

#: A server of its own, on two rank processes.
pytestmark = pytest.mark.slow

DOCS_COMMAND = (
    "--enable-auto-tool-choice", "--tool-call-parser", "hermes", "--max-model-len", "256",
    "--enable-prefix-caching", "--max-num-seqs", "8", "-tp", "2",
)
EXTRA = (
    "--kv-cache-memory-bytes", "16777216", "--root-path", "/proxy", "--served-model-name", "first", "second",
    "--max-logprobs", "-1", "--enable-prompt-tokens-details", "--enable-force-include-usage",
    "--return-tokens-as-token-ids", "--disable-log-stats",
)


@pytest.fixture(scope="module")
def vllm_server(demo_model: Path, cache_dir: Path) -> Iterator[ServerProcess]:
    process = ServerProcess(*DOCS_COMMAND, *EXTRA, cache_dir=cache_dir)
    yield process
    process.stop()


@pytest.fixture(scope="module")
def http(vllm_server: ServerProcess) -> Iterator[httpx.Client]:
    with httpx.Client(base_url=vllm_server.url, timeout=60) as client:
        yield client


def test_the_docs_command_line_serves_on_two_ranks_with_one_note(vllm_server: ServerProcess) -> None:
    output = vllm_server.output()
    assert "TP 2" in output
    notes = [line for line in output.splitlines() if line.startswith("accord serve: note:")]
    assert notes == ["accord serve: note: --disable-log-stats has no effect in accord (accord logs and measures "
                     "through its own logging and /metrics)"]


def test_tool_calls_work_on_the_docs_command_line(vllm_server: ServerProcess) -> None:
    client = openai.OpenAI(base_url=f"{vllm_server.url}/v1", api_key="none", max_retries=0, timeout=60)
    tools = [{"type": "function", "function": {"name": "f", "parameters": {
        "type": "object", "properties": {"a": {"enum": [1, 2]}}, "required": ["a"], "additionalProperties": False}}}]
    response = client.chat.completions.create(
        model="first", messages=[{"role": "user", "content": "call f"}], tools=tools, tool_choice="required",
        max_tokens=120, parallel_tool_calls=False,
    )
    [call] = response.choices[0].message.tool_calls
    assert call.function.name == "f" and json.loads(call.function.arguments)["a"] in (1, 2)


@pytest.mark.parametrize("prefix", ["", "/proxy"])
def test_routes_answer_under_the_root_path_too(http: httpx.Client, prefix: str) -> None:
    models = http.get(f"{prefix}/v1/models")
    assert models.status_code == 200 and models.json()["data"][0]["id"] == "first"


def test_every_served_model_name_is_accepted_and_the_first_reported(http: httpx.Client) -> None:
    body = http.post("/v1/completions", json={"model": "second", "prompt": "hi", "max_tokens": 1}).json()
    assert body["model"] == "first"
    assert http.post("/v1/completions", json={"model": "third", "prompt": "hi"}).status_code == 404


def test_max_logprobs_minus_1_allows_the_whole_vocabulary(http: httpx.Client, demo_model: Path) -> None:
    vocab = json.loads((demo_model / "config.json").read_text())["vocab_size"]
    body = {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 1, "logprobs": True, "top_logprobs": -1}
    [entry] = http.post("/v1/chat/completions", json=body).json()["choices"][0]["logprobs"]["content"]
    assert len(entry["top_logprobs"]) == vocab and entry["top_logprobs"][0]["token"] == entry["token"]
    assert entry["token"].startswith("token_id:")  # --return-tokens-as-token-ids


def test_cached_prompt_tokens_are_reported(http: httpx.Client) -> None:
    prompt = "a prompt long enough to fill two blocks of sixteen tokens " * 2
    first = http.post("/v1/completions", json={"prompt": prompt, "max_tokens": 1}).json()["usage"]
    again = http.post("/v1/completions", json={"prompt": prompt, "max_tokens": 1}).json()["usage"]
    assert first["prompt_tokens_details"] == {"cached_tokens": 0}
    # Whole blocks of the repeated prompt come from the cache (16-token blocks).
    cached = again["prompt_tokens_details"]["cached_tokens"]
    assert cached > 0 and cached % 16 == 0 and cached < again["prompt_tokens"]


@pytest.mark.parametrize("route, body", [("/v1/completions", {"prompt": "hi"}),
                                         ("/v1/chat/completions", {"messages": [{"role": "user", "content": "hi"}]})])
def test_every_stream_chunk_carries_usage_when_forced(http: httpx.Client, route: str, body: dict) -> None:
    # vLLM's --enable-force-include-usage forces include_usage and continuous_usage_stats
    # both (its `should_include_usage` answers (True, True)), whatever the request says.
    body = {**body, "max_tokens": 2, "ignore_eos": True, "stream": True}
    with http.stream("POST", route, json=body) as response:
        chunks = [json.loads(line[6:]) for line in response.iter_lines() if line.startswith("data: {")]
    assert chunks[-1]["choices"] == [] and chunks[-1]["usage"]["completion_tokens"] == 2
    assert all(chunk["usage"] is not None for chunk in chunks)
    counts = [chunk["usage"]["completion_tokens"] for chunk in chunks]
    assert counts == sorted(counts) and all(u["usage"]["total_tokens"] == u["usage"]["prompt_tokens"]
                                            + u["usage"]["completion_tokens"] for u in chunks)
