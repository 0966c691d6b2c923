"""`accord serve` serves a DeepSeek-V4 checkpoint: the completion of a token-id prompt
equals transformers' prefix-only greedy continuation on the same tiny random model."""

from __future__ import annotations

import sys
from pathlib import Path

import httpx
import pytest
from server_harness import ServerProcess

# The tiny V4 builder lives with the model tests (one definition of the test model).
sys.path.insert(0, str(Path(__file__).parents[1] / "models"))
from deepseek_v4_models import build_v4_dir, prefix_only_greedy  # noqa: E402

PROMPT = [5, 17, 99, 3, 42, 7, 150, 23, 8, 61, 77, 12, 190, 4, 33, 90, 21, 64, 11, 140, 9, 55, 18]
NEW_TOKENS = 4


@pytest.fixture(scope="module")
def v4_server(tmp_path_factory: pytest.TempPathFactory):
    model_dir = build_v4_dir(tmp_path_factory.mktemp("deepseek_v4_serve") / "model")
    flags = (
        "--model", str(model_dir), "--backend", "cpu", "--max-model-len", "128", "--block-size", "4",
        "--max-num-batched-tokens", "16", "--kv-cache-memory-bytes", str(8 << 20),
    )
    server = ServerProcess(*flags, cache_dir=tmp_path_factory.mktemp("cache"))
    yield server, model_dir
    server.stop()


@pytest.mark.slow
def test_accord_serve_completes_like_transformers_prefix_only(v4_server) -> None:
    server, model_dir = v4_server
    body = {
        "model": str(model_dir), "prompt": PROMPT, "max_tokens": NEW_TOKENS, "temperature": 0, "ignore_eos": True,
        "logprobs": 0, "return_tokens_as_token_ids": True,
    }
    response = httpx.post(f"{server.url}/v1/completions", json=body, timeout=120)
    assert response.status_code == 200, response.text
    tokens = [int(t.removeprefix("token_id:")) for t in response.json()["choices"][0]["logprobs"]["tokens"]]
    assert tokens == prefix_only_greedy(model_dir, [PROMPT], NEW_TOKENS)[0]
