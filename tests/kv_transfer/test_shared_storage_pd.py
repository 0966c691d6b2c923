"""Prefill/decode disaggregation over SharedStorageConnector with two engines in one
process: the producer computes and saves each prompt's KV, the consumer loads it and
computes only the last prompt token (its logits sample the first output token, as
vLLM's decode instance does). The reference is a third engine with no connector. A
producer and a consumer of different KV specs hand over through kv_convert."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from safetensors import safe_open
from safetensors.torch import load_file, save_file

from accord import LLM
from accord.backends import get_backend
from accord.core.kv_transfer.base import BlockTransfer, KVConnectorMetadata
from accord.core.kv_transfer.config import KVTransferConfig
from accord.core.kv_transfer.shared_storage import SharedStorageWorker
from accord.core.sampling_params import SamplingParams
from accord.op_contracts import OpDispatcher

ENGINE_ARGS = dict(backend="cpu", max_model_len=256, num_gpu_blocks_override=48, max_num_batched_tokens=256,
                   block_size=16)
PROMPTS = [
    "The history of the harbour town begins with a fishing village on the north shore",
    "Write a list of colours: red, green, blue, yellow, purple, orange, brown, black, white",
    "a b c d e f g h i j k l m n o p q r s t u v w x y z and then once more a b c d e f",
]


def _connector(role: str, path: Path) -> dict:
    return {"kv_connector": "SharedStorageConnector", "kv_role": role,
            "kv_connector_extra_config": {"shared_storage_path": str(path)}}


def _greedy(max_tokens: int, kv_transfer_params: dict | None = None) -> SamplingParams:
    extra = None if kv_transfer_params is None else {"kv_transfer_params": kv_transfer_params}
    return SamplingParams(temperature=0.0, max_tokens=max_tokens, ignore_eos=True, extra_args=extra)


def _free_blocks(llm: LLM) -> int:
    return llm.llm_engine.scheduler.block_manager.num_free_blocks


@pytest.mark.parametrize("model", ["llama_dir", pytest.param("deepseek_v3_dir", marks=pytest.mark.slow)])
def test_decode_instance_continues_the_prefill_instances_kv_with_the_same_greedy_text(
    model: str, request: pytest.FixtureRequest, tmp_path: Path
) -> None:
    model_dir = str(request.getfixturevalue(model))
    plain = LLM(model_dir, **ENGINE_ARGS)
    prefill = LLM(model_dir, kv_transfer_config=_connector("kv_producer", tmp_path), **ENGINE_ARGS)
    decode = LLM(model_dir, kv_transfer_config=_connector("kv_consumer", tmp_path), **ENGINE_ARGS)
    start = {llm: _free_blocks(llm) for llm in (plain, prefill, decode)}
    expected = [out.outputs[0].token_ids for out in plain.generate(PROMPTS, _greedy(12))]

    # The router's PD flow: prefill with max_tokens=1, then decode with what it returned.
    prefilled = prefill.generate(PROMPTS, _greedy(1, {"do_remote_decode": True}))
    params = [out.kv_transfer_params for out in prefilled]
    assert all(p is not None and p["do_remote_prefill"] for p in params)
    before = decode.llm_engine.stats.computed_prompt_tokens
    decoded = [decode.generate([prompt], _greedy(12, p))[0] for prompt, p in zip(PROMPTS, params)]

    assert [out.outputs[0].token_ids for out in decoded] == expected
    # One prompt token per request computed (the last), the rest loaded.
    assert decode.llm_engine.stats.computed_prompt_tokens - before == len(PROMPTS)
    assert [out.num_cached_tokens for out in decoded] == [len(out.prompt_token_ids) - 1 for out in decoded]
    assert {llm: _free_blocks(llm) for llm in start} == start


def test_a_consumer_without_the_producers_kv_computes_the_prompt_itself(llama_dir: Path, tmp_path: Path) -> None:
    decode = LLM(str(llama_dir), kv_transfer_config=_connector("kv_consumer", tmp_path), **ENGINE_ARGS)
    plain = LLM(str(llama_dir), **ENGINE_ARGS)
    expected = plain.generate(PROMPTS[:1], _greedy(6))[0].outputs[0].token_ids
    before = decode.llm_engine.stats.computed_prompt_tokens
    # The prefill instance died before saving: the params point at KV that is not there.
    out = decode.generate(PROMPTS[:1], _greedy(6, {"do_remote_prefill": True}))[0]
    assert out.outputs[0].token_ids == expected
    assert decode.llm_engine.stats.computed_prompt_tokens - before == len(out.prompt_token_ids)


#: (prefill instance, decode instance) engine settings whose KV specs differ: cache
#: dtype, block size and backend.
CROSS_SPEC = {
    "cpu-bf16-bs16 to reference-fp32-bs8": (dict(backend="cpu", dtype="bfloat16"), dict(backend="reference", block_size=8)),
    "reference-fp32 to cpu-bf16": (dict(backend="reference"), dict(backend="cpu", dtype="bfloat16")),
}


@pytest.mark.parametrize("specs", CROSS_SPEC.values(), ids=CROSS_SPEC.keys())
def test_a_decode_instance_of_another_kv_spec_continues_through_kv_convert_with_its_own_greedy_text(
    specs: tuple[dict, dict], llama_dir: Path, tmp_path: Path
) -> None:
    prefill_args, decode_args = ({**ENGINE_ARGS, **args} for args in specs)
    prefill = LLM(str(llama_dir), kv_transfer_config=_connector("kv_producer", tmp_path), **prefill_args)
    decode = LLM(str(llama_dir), kv_transfer_config=_connector("kv_consumer", tmp_path), **decode_args)
    # One instance of the decode side's spec, computing everything itself.
    expected = [out.outputs[0].token_ids for out in LLM(str(llama_dir), **decode_args).generate(PROMPTS, _greedy(12))]
    start = _free_blocks(decode)
    params = [out.kv_transfer_params for out in prefill.generate(PROMPTS, _greedy(1, {"do_remote_decode": True}))]
    before = decode.llm_engine.stats.computed_prompt_tokens
    decoded = [decode.generate([prompt], _greedy(12, p))[0] for prompt, p in zip(PROMPTS, params)]
    assert [out.outputs[0].token_ids for out in decoded] == expected
    assert decode.llm_engine.stats.computed_prompt_tokens - before == len(PROMPTS)
    assert _free_blocks(decode) == start


def _load_into(cache: torch.Tensor, tmp_path: Path, key: str, num_tokens: int, slots_block_size: int) -> None:
    """Run the consumer worker's load of `key`'s first layer key into `cache`, block
    table 0, 1, 2, ... (the transfer path an engine step runs)."""
    config = KVTransferConfig.parse(_connector("kv_consumer", tmp_path))
    worker = SharedStorageWorker(config, slots_block_size, 0, OpDispatcher(get_backend("reference"), strict=True))
    worker.register_kv_caches([(cache,)])
    blocks = tuple(range(cache.shape[0]))
    worker.start_load_kv(KVConnectorMetadata(loads=[BlockTransfer("r", key, blocks, 0, num_tokens)]))


def test_an_fp32_transfer_into_an_fp8_cache_stores_what_the_fp8_cache_writer_stores(
    llama_dir: Path, tmp_path: Path
) -> None:
    """Layer 0's keys depend only on the prompt, so an fp8 instance computing them
    itself (reshape_and_cache) and an fp32 producer's keys converted by kv_convert
    must agree bit for bit. (Deeper layers differ: the fp8 instance's attention reads
    fp8, which is why greedy text is not compared across an fp8 cache.)"""
    fp8_store = tmp_path / "fp8"
    for store, extra in ((tmp_path, {}), (fp8_store, {"kv_cache_dtype": "fp8"})):
        producer = LLM(str(llama_dir), kv_transfer_config=_connector("kv_producer", store), **ENGINE_ARGS, **extra)
        producer.generate(PROMPTS[:1], _greedy(1, {"do_remote_decode": True}))
    (key_dir,) = [path.name for path in tmp_path.iterdir() if path.name != "fp8"]
    computed = load_file(str(fp8_store / key_dir / "rank0.safetensors"))["layer0.0"]
    num_tokens, heads, head_size = computed.shape
    # The consumer's block size differs too: 8 against the producer's 16.
    cache = torch.zeros(-(-num_tokens // 8), 8, heads, head_size, dtype=computed.dtype)
    _load_into(cache, tmp_path, key_dir, num_tokens, 8)
    assert torch.equal(cache.view(-1, heads, head_size)[:num_tokens].view(torch.uint8), computed.view(torch.uint8))


@pytest.mark.parametrize("async_load", [True, False])
def test_kv_of_another_layout_is_computed_here_or_fails_the_request_cleanly(
    llama_dir: Path, tmp_path: Path, async_load: bool
) -> None:
    consumer = _connector("kv_consumer", tmp_path)
    consumer["kv_connector_extra_config"]["async_load"] = async_load
    prefill = LLM(str(llama_dir), kv_transfer_config=_connector("kv_producer", tmp_path), **ENGINE_ARGS)
    decode = LLM(str(llama_dir), kv_transfer_config=consumer, **ENGINE_ARGS)
    params = prefill.generate(PROMPTS[:1], _greedy(1, {"do_remote_decode": True}))[0].kv_transfer_params
    # The file as another model (twice the head size) would have saved it.
    path = tmp_path / params["remote_storage_key"] / "rank0.safetensors"
    with safe_open(str(path), framework="pt") as stored:
        tensors, metadata = {name: stored.get_tensor(name) for name in stored.keys()}, stored.metadata()
    save_file({name: torch.cat([t, t], dim=-1) for name, t in tensors.items()}, str(path), metadata=metadata)
    expected = LLM(str(llama_dir), **ENGINE_ARGS).generate(PROMPTS[:2], _greedy(4))
    start = _free_blocks(decode)
    computed = decode.llm_engine.stats.computed_prompt_tokens
    transferred, local = decode.generate(PROMPTS[:2], [_greedy(4, params), _greedy(4)])
    assert local.outputs[0].token_ids == expected[1].outputs[0].token_ids
    if async_load:
        # The load failed off the step path: the request computed its prompt instead.
        assert transferred.outputs[0].token_ids == expected[0].outputs[0].token_ids
        assert decode.llm_engine.stats.kv_loads_failed == 1
        assert decode.llm_engine.stats.computed_prompt_tokens - computed == sum(
            len(out.prompt_token_ids) for out in expected
        )
    else:
        # One step: the transferred request fails; the other, computed here, is unharmed.
        assert transferred.outputs[0].finish_reason == "error"
        assert "another KV layout" in str(transferred.outputs[0].stop_reason)
    assert _free_blocks(decode) == start
