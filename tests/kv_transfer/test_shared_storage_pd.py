"""Prefill/decode disaggregation over SharedStorageConnector with two engines in one
process: the producer computes and saves each prompt's KV, the consumer loads it and
computes only the last prompt token (its logits sample the first output token, as
vLLM's decode instance does). The reference is a third engine with no connector."""

from __future__ import annotations

from pathlib import Path

import pytest

from accord import LLM
from accord.core.sampling_params import SamplingParams

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


def test_kv_of_another_dtype_fails_the_request_cleanly_naming_kv_convert(llama_dir: Path, tmp_path: Path) -> None:
    prefill = LLM(str(llama_dir), kv_transfer_config=_connector("kv_producer", tmp_path), **ENGINE_ARGS)
    # A bf16 cache on the decode side, fp32 KV from the prefill side: a cross-spec transfer.
    decode = LLM(str(llama_dir), dtype="bfloat16", kv_transfer_config=_connector("kv_consumer", tmp_path),
                 **ENGINE_ARGS)
    params = prefill.generate(PROMPTS[:1], _greedy(1, {"do_remote_decode": True}))[0].kv_transfer_params
    expected = LLM(str(llama_dir), dtype="bfloat16", **ENGINE_ARGS).generate(PROMPTS[1:2], _greedy(4))
    start = _free_blocks(decode)
    # One step: the transferred request fails; the other, computed here, is unharmed.
    transferred, local = decode.generate(PROMPTS[:2], [_greedy(4, params), _greedy(4)])
    assert transferred.outputs[0].finish_reason == "error" and "kv_convert" in str(transferred.outputs[0].stop_reason)
    assert local.outputs[0].token_ids == expected[0].outputs[0].token_ids
    assert _free_blocks(decode) == start
