"""The offline LLM API under hostile input (issue 13, findings 1 and 11): a bad request
is refused before anything is queued, and the engine stays usable."""

from __future__ import annotations

import pytest

from accord import SamplingParams
from accord.demo.model import DEMO_MODEL_NAME

GREEDY = SamplingParams(temperature=0.0, max_tokens=3, ignore_eos=True)


def test_a_bad_setting_is_refused_and_the_llm_stays_usable(offline_llm) -> None:
    with pytest.raises(ValueError, match="top_k"):
        offline_llm.generate("x", SamplingParams(top_k=2**40), use_tqdm=False)
    with pytest.raises(ValueError, match="stop_token_ids"):
        offline_llm.generate("x", SamplingParams(stop_token_ids=[10**6], min_tokens=1), use_tqdm=False)
    assert not offline_llm.llm_engine.has_unfinished_requests()
    [output] = offline_llm.generate("x", GREEDY, use_tqdm=False)
    assert len(output.outputs[0].token_ids) == 3


def test_a_bad_prompt_midway_leaves_nothing_queued(offline_llm) -> None:
    with pytest.raises(ValueError):
        offline_llm.generate(["good", {"prompt_token_ids": []}, "never queued"], GREEDY, use_tqdm=False)
    assert not offline_llm.llm_engine.has_unfinished_requests()
    outputs = offline_llm.generate(["a", "b"], GREEDY, use_tqdm=False)
    assert [o.prompt for o in outputs] == ["a", "b"]  # nothing left over from the failed call


def test_a_plain_list_of_ints_is_one_token_id_prompt(offline_llm) -> None:
    ids = offline_llm.get_tokenizer().encode("Hello there")
    [by_ids] = offline_llm.generate(ids, GREEDY, use_tqdm=False)
    [by_text] = offline_llm.generate("Hello there", GREEDY, use_tqdm=False)
    assert by_ids.prompt_token_ids == ids
    assert by_ids.outputs[0].token_ids == by_text.outputs[0].token_ids


def test_a_list_of_other_things_gets_a_clear_error(offline_llm) -> None:
    with pytest.raises(ValueError, match="a prompt is"):
        offline_llm.generate([1.5, 2.5], GREEDY, use_tqdm=False)


def test_chat_outputs_carry_the_rendered_prompt(offline_llm) -> None:
    messages = [{"role": "user", "content": "hi"}]
    [output] = offline_llm.chat(messages, GREEDY, use_tqdm=False)
    tokenizer = offline_llm.get_tokenizer()
    assert output.prompt == tokenizer.apply_chat_template(messages, add_generation_prompt=True)
    assert output.prompt_token_ids == tokenizer.encode(output.prompt, add_special_tokens=False)


def test_the_demo_model_is_found_by_name(cache_dir, monkeypatch) -> None:
    import accord

    monkeypatch.setenv("ACCORD_CACHE_DIR", str(cache_dir))
    llm = accord.LLM(DEMO_MODEL_NAME, max_model_len=64, max_num_seqs=2, backend="cpu")
    try:
        [output] = llm.generate("Hi", GREEDY, use_tqdm=False)
        assert len(output.outputs[0].token_ids) == 3
    finally:
        llm.llm_engine.shutdown()


def test_the_default_kv_budget_is_what_the_limits_can_use(demo_model) -> None:
    import accord

    # No kv_cache_memory: the CPU default (4 GiB) is capped at max_num_seqs full contexts.
    llm = accord.LLM(str(demo_model), max_model_len=64, max_num_seqs=2, block_size=16, backend="cpu")
    try:
        assert llm.llm_engine.scheduler.block_manager.num_blocks == 2 * (64 // 16)
    finally:
        llm.llm_engine.shutdown()
