"""Serving adapters over the OpenAI API (in process): `--lora-modules` adapters are
named in `model` and listed in /v1/models with the base as parent, each request gets
the greedy tokens of transformers with its adapter merged by PEFT, /metrics counts each
adapter's tokens, an unknown model is vLLM's 404, and the load/unload endpoints (only
when allowed) add and drop adapters at run time, refusing a bad adapter with a 400
naming the problem."""

from __future__ import annotations

import asyncio
from pathlib import Path

import httpx
import pytest
from lora_helpers import merged_greedy
from prometheus_client.parser import text_string_to_metric_families

from accord import AsyncLLM
from accord.server.app import create_app
from accord.server.lora_modules import LoRAModulePath
from accord.server.options import ServerOptions
from accord.server.serving import ServedModel

PROMPT = [1, 17, 33, 90, 5, 61, 7]
MAX_TOKENS = 6


def completion_body(model: str) -> dict:
    return {"model": model, "prompt": PROMPT, "max_tokens": MAX_TOKENS, "temperature": 0, "logprobs": 0,
            "return_tokens_as_token_ids": True}


def token_ids(response: httpx.Response) -> list[int]:
    assert response.status_code == 200, response.text
    return [int(t.removeprefix("token_id:")) for t in response.json()["choices"][0]["logprobs"]["tokens"]]


@pytest.mark.slow
def test_adapters_served_by_name_loaded_and_unloaded_at_run_time(
    llama_dir: Path, llama_adapters: dict[str, Path], tmp_path: Path
) -> None:
    engine = AsyncLLM.from_engine_args(str(llama_dir), backend="cpu", enable_lora=True, max_loras=2,
                                       max_model_len=64, kv_cache_memory=1 << 22)
    served = ServedModel("tiny", str(llama_dir), engine.max_model_len, engine.model_config.vocab_size)
    options = ServerOptions(lora_modules=(LoRAModulePath("a", str(llama_adapters["a"])),),
                            allow_runtime_lora_updating=True)
    app = create_app(engine, served, options)
    # Over the same engine, without --allow-runtime-lora-updating.
    locked = create_app(engine, served, ServerOptions())
    want = {name: merged_greedy(llama_dir, path, [PROMPT], MAX_TOKENS)[0]
            for name, path in {"tiny": None, **llama_adapters}.items()}
    (tmp_path / "empty").mkdir()

    async def scenario() -> None:
        async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://test") as client:
            models = (await client.get("/v1/models")).json()["data"]
            assert [(m["id"], m["parent"]) for m in models] == [("tiny", None), ("a", "tiny")]
            base, adapter = await asyncio.gather(
                client.post("/v1/completions", json=completion_body("tiny")),
                client.post("/v1/completions", json=completion_body("a")),
            )
            assert token_ids(base) == want["tiny"] and token_ids(adapter) == want["a"]
            # /metrics counts the adapter's tokens under its name, and none for the base.
            scraped = text_string_to_metric_families((await client.get("/metrics")).text)
            per_adapter = {s.labels["lora_name"]: s.value for family in scraped for s in family.samples
                           if s.name == "accord:lora_generation_tokens_total"}
            assert per_adapter == {"a": MAX_TOKENS}

            unknown = await client.post("/v1/completions", json=completion_body("b"))
            assert unknown.status_code == 404
            assert unknown.json()["error"]["code"] == "model_not_found"
            assert unknown.json()["error"]["message"].startswith("The model `b` does not exist.")

            bad = await client.post("/v1/load_lora_adapter", json={"lora_name": "b", "lora_path": str(tmp_path / "empty")})
            assert bad.status_code == 400 and "adapter_config.json is missing" in bad.json()["error"]["message"]
            loaded = await client.post("/v1/load_lora_adapter", json={"lora_name": "b", "lora_path": str(llama_adapters["b"])})
            assert loaded.status_code == 200, loaded.text
            again = await client.post("/v1/load_lora_adapter", json={"lora_name": "b", "lora_path": str(llama_adapters["b"])})
            assert again.status_code == 400 and "already been loaded" in again.json()["error"]["message"]
            assert token_ids(await client.post("/v1/completions", json=completion_body("b"))) == want["b"]

            assert (await client.post("/v1/unload_lora_adapter", json={"lora_name": "b"})).status_code == 200
            assert (await client.post("/v1/completions", json=completion_body("b"))).status_code == 404
            assert (await client.post("/v1/unload_lora_adapter", json={"lora_name": "b"})).status_code == 404
            assert [m["id"] for m in (await client.get("/v1/models")).json()["data"]] == ["tiny", "a"]
        async with httpx.AsyncClient(transport=httpx.ASGITransport(app=locked), base_url="http://test") as client:
            body = {"lora_name": "b", "lora_path": str(llama_adapters["b"])}
            assert (await client.post("/v1/load_lora_adapter", json=body)).status_code == 404

    try:
        asyncio.run(scenario())
    finally:
        asyncio.run(engine.shutdown())



def test_lora_modules_on_an_engine_without_lora_are_refused_at_start(llama_dir: Path) -> None:
    class EngineWithoutLoRA:
        """What the app asks of an engine at start, LoRA off (LLMEngine.add_lora's refusal)."""

        tokenizer = None

        def get_replica_stats(self) -> list:
            return []

        def add_lora(self, request) -> bool:
            raise ValueError(f"LoRA adapter {request.lora_name!r} asked for, but LoRA is off (enable_lora)")

    served = ServedModel("tiny", str(llama_dir), 64, 100)
    options = ServerOptions(lora_modules=(LoRAModulePath("a", "/adapters/a"),))
    with pytest.raises(ValueError, match="--lora-modules a: LoRA adapter 'a' asked for, but LoRA is off"):
        create_app(EngineWithoutLoRA(), served, options)  # type: ignore[arg-type]
