"""MLPerf TEST06-style checks through the real server path: the OpenAI app in process,
greedy completions with token ids in the logprobs, streamed and not. The first
streamed token must equal token 0 of the non-streamed result, a response may hold at
most one EOS and only at its end, and usage.completion_tokens must equal the tokens
actually produced."""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any, Sequence

from ..core.engine.async_llm import AsyncLLM
from ..core.engine.llm_engine import LLMEngine
from .reports import Check, CheckStatus
from .smoke import Prompt

GROUP = "server"
MODEL_NAME = "gate"


@dataclass(frozen=True)
class ServedCompletion:
    """What one greedy completion returned: token ids and the reported usage count."""

    token_ids: list[int]
    completion_tokens: int | None


def _token_ids(logprobs: dict[str, Any] | None) -> list[int]:
    tokens = (logprobs or {}).get("tokens") or []
    return [int(token.removeprefix("token_id:")) for token in tokens]


def _request(prompt: Prompt, max_tokens: int, stream: bool) -> dict[str, Any]:
    body = {
        "model": MODEL_NAME, "prompt": list(prompt.token_ids), "max_tokens": max_tokens, "temperature": 0.0,
        "logprobs": 0, "return_tokens_as_token_ids": True, "stream": stream,
    }
    if stream:
        body["stream_options"] = {"include_usage": True}
    return body


def _complete(client: Any, prompt: Prompt, max_tokens: int) -> ServedCompletion:
    response = client.post("/v1/completions", json=_request(prompt, max_tokens, stream=False))
    response.raise_for_status()
    body = response.json()
    return ServedCompletion(_token_ids(body["choices"][0].get("logprobs")), body["usage"]["completion_tokens"])


def _stream(client: Any, prompt: Prompt, max_tokens: int) -> ServedCompletion:
    token_ids: list[int] = []
    usage = None
    with client.stream("POST", "/v1/completions", json=_request(prompt, max_tokens, stream=True)) as response:
        response.raise_for_status()
        for line in response.iter_lines():
            if not line.startswith("data: ") or line == "data: [DONE]":
                continue
            chunk = json.loads(line.removeprefix("data: "))
            for choice in chunk.get("choices") or []:
                token_ids += _token_ids(choice.get("logprobs"))
            if chunk.get("usage"):
                usage = chunk["usage"]["completion_tokens"]
    return ServedCompletion(token_ids, usage)


def first_token_problem(whole: ServedCompletion, streamed: ServedCompletion) -> str | None:
    """Why the first streamed token is not token 0 of the non-streamed result, if so."""
    if whole.token_ids[:1] == streamed.token_ids[:1] and whole.token_ids:
        return None
    return f"streamed {streamed.token_ids[:1]} vs non-streamed {whole.token_ids[:1]}"


def eos_problem(result: ServedCompletion, eos_ids: set[int]) -> str | None:
    """Why the response does not hold at most one EOS, at its end, if so."""
    positions = [i for i, token in enumerate(result.token_ids) if token in eos_ids]
    if len(positions) > 1 or (positions and positions[-1] != len(result.token_ids) - 1):
        return f"EOS at positions {positions} of {len(result.token_ids)}"
    return None


def usage_problem(result: ServedCompletion) -> str | None:
    """Why usage.completion_tokens is not the number of tokens produced, if so."""
    if result.completion_tokens == len(result.token_ids):
        return None
    return f"usage says {result.completion_tokens}, produced {len(result.token_ids)}"


def _check(name: str, problems: list[str], figures: dict[str, float | int | None]) -> Check:
    if problems:
        return Check(name, GROUP, CheckStatus.FAIL, "; ".join(problems), figures)
    return Check(name, GROUP, CheckStatus.PASS, "", figures)


def server_checks(engine: LLMEngine, prompts: Sequence[Prompt], max_tokens: int) -> list[Check]:
    """Serve `engine` in process and run the three checks over `prompts`."""
    from fastapi.testclient import TestClient  # the server stack loads only for these checks

    from ..server.app import create_app
    from ..server.serving import ServedModel

    served = ServedModel(MODEL_NAME, engine.config.model, engine.max_model_len, engine.model_config.vocab_size)
    eos_ids = set(engine.model_config.eos_token_ids)
    first_token, eos, usage = [], [], []
    with TestClient(create_app(AsyncLLM(engine), served)) as client:
        for prompt in prompts:
            whole, streamed = _complete(client, prompt, max_tokens), _stream(client, prompt, max_tokens)
            first_token.append(_labelled(prompt.label, first_token_problem(whole, streamed)))
            for label, result in ((f"{prompt.label}, non-streamed", whole), (f"{prompt.label}, streamed", streamed)):
                eos.append(_labelled(label, eos_problem(result, eos_ids)))
                usage.append(_labelled(label, usage_problem(result)))
    figures = {"prompts": len(prompts)}
    return [
        _check("first streamed token equals non-streamed token 0", [p for p in first_token if p], figures),
        _check("at most one terminal EOS", [p for p in eos if p], figures),
        _check("usage.completion_tokens equals tokens produced", [p for p in usage if p], figures),
    ]


def _labelled(label: str, problem: str | None) -> str | None:
    return None if problem is None else f"{label}: {problem}"
