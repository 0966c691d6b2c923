"""Loading and unloading adapters through the server's endpoints while requests run:
requests streaming on adapter A and on adapter A2 keep their adapter's tokens while B is
loaded and A2 is unloaded under them; a new request for A2 gets vLLM's 404; B serves at
once; A2's device slot and host copy are freed with the first step after its last
request ended; and every KV block is free at the end."""

from __future__ import annotations

import asyncio
from pathlib import Path

import httpx
import pytest
from lora_helpers import ADAPTER_A, make_adapter, merged_greedy
from test_lora_server import PROMPT, completion_body, token_ids

from accord import AsyncLLM, LoRARequest, SamplingParams
from accord.server.app import create_app
from accord.server.lora_modules import LoRAModulePath
from accord.server.options import ServerOptions
from accord.server.serving import ServedModel

#: Long enough that the streams are still running when the adapters change (each stream
#: has yielded its first token, and no more than one, before the changes: see below).
STREAM_TOKENS = 12


@pytest.mark.slow
def test_load_and_unload_while_requests_run_on_adapters(
    llama_dir: Path, llama_adapters: dict[str, Path], tmp_path: Path
) -> None:
    paths = {"a": llama_adapters["a"], "a2": make_adapter(llama_dir, tmp_path / "a2", seed=5, **ADAPTER_A),
             "b": llama_adapters["b"]}
    engine = AsyncLLM.from_engine_args(str(llama_dir), backend="cpu", enable_lora=True, max_loras=3,
                                       max_model_len=64, kv_cache_memory=1 << 22)
    served = ServedModel("tiny", str(llama_dir), engine.max_model_len, engine.model_config.vocab_size)
    modules = (LoRAModulePath("a", str(paths["a"])), LoRAModulePath("a2", str(paths["a2"])))
    app = create_app(engine, served, ServerOptions(lora_modules=modules, allow_runtime_lora_updating=True))
    want = {name: merged_greedy(llama_dir, path, [PROMPT], STREAM_TOKENS)[0] for name, path in paths.items()}
    assert want["a"] != want["a2"]
    runner = engine.engine.executor.driver_worker.runner
    # The server numbers its adapters in --lora-modules order.
    streamed = {"a": LoRARequest("a", 1, str(paths["a"])), "a2": LoRARequest("a2", 2, str(paths["a2"]))}
    params = SamplingParams(temperature=0.0, max_tokens=STREAM_TOKENS, ignore_eos=True)

    async def scenario() -> None:
        streams = {name: engine.generate({"prompt_token_ids": PROMPT}, params, f"stream-{name}", lora_request=lora)
                   for name, lora in streamed.items()}
        # Each stream's first output: both requests are running, and neither is done.
        firsts = {name: await anext(stream) for name, stream in streams.items()}
        assert not any(output.finished for output in firsts.values())
        async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://test") as client:
            body = {"lora_name": "b", "lora_path": str(paths["b"])}
            assert (await client.post("/v1/load_lora_adapter", json=body)).status_code == 200
            assert (await client.post("/v1/unload_lora_adapter", json={"lora_name": "a2"})).status_code == 200
            unloaded = await client.post("/v1/completions", json=completion_body("a2"))
            assert unloaded.status_code == 404 and unloaded.json()["error"]["code"] == "model_not_found"
            b_tokens = token_ids(await client.post("/v1/completions", json=completion_body("b")))
            finals = {}
            for name, stream in streams.items():
                async for output in stream:
                    finals[name] = output
            # The next step tells the workers that A2's request ended (they free it then).
            assert (await client.post("/v1/completions", json=completion_body("tiny"))).status_code == 200
        assert b_tokens == want["b"][: len(b_tokens)]
        for name, output in finals.items():
            assert output.finished and list(output.outputs[0].token_ids) == want[name], name

    try:
        asyncio.run(scenario())
        # A2's request ran to its end on its adapter, then its slot and host copy were freed.
        assert 2 not in runner.lora.resident and 2 not in runner.lora.host_cached
        assert {1, 3} <= set(runner.lora.resident)
        manager = engine.engine.scheduler.block_manager
        assert manager.num_free_blocks == manager.num_blocks
    finally:
        asyncio.run(engine.shutdown())
