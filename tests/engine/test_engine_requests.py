"""Per-request behaviour through `LLM.generate`: prefix reuse, stops, budgets, n > 1,
logprobs, penalties and seeds, each checked against an independent computation."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from engine_faults import POISON_TOKEN, poison_the_model

from accord import LLM, SamplingParams
from accord.core.worker.sampler import step_seed

ENGINE_ARGS = dict(backend="cpu", max_model_len=1024, max_num_batched_tokens=256, num_gpu_blocks_override=256)


@pytest.fixture(scope="module")
def llm(llama_dir: Path, make_llm) -> LLM:
    return make_llm(llama_dir, **ENGINE_ARGS)


@pytest.fixture(scope="module")
def hf_model(llama_dir: Path):
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(llama_dir, dtype=torch.float32).eval()


def random_prompt(length: int, seed: int, vocab_size: int = 800) -> list[int]:
    return torch.randint(0, vocab_size, (length,), generator=torch.Generator().manual_seed(seed)).tolist()


def greedy(max_tokens: int = 4, **kwargs) -> SamplingParams:
    return SamplingParams(temperature=0.0, max_tokens=max_tokens, ignore_eos=True, **kwargs)


def run(llm: LLM, prompt: list[int], params: SamplingParams):
    return llm.generate({"prompt_token_ids": prompt}, params, use_tqdm=False)[0]


def test_a_shared_512_token_prefix_is_computed_once(llm: LLM) -> None:
    prefix = random_prompt(512, seed=10)
    run(llm, prefix + random_prompt(20, seed=11), greedy())
    before = llm.llm_engine.stats.computed_prompt_tokens
    second = run(llm, prefix + random_prompt(30, seed=12), greedy())
    assert second.num_cached_tokens == 512
    assert llm.llm_engine.stats.computed_prompt_tokens - before == 30


def test_text_prompts_are_tokenized_and_outputs_detokenized(llm: LLM) -> None:
    output = llm.generate("The quick brown fox", greedy(max_tokens=6), use_tqdm=False)[0]
    tokenizer = llm.get_tokenizer()
    assert output.prompt_token_ids == list(tokenizer.encode("The quick brown fox"))
    assert output.outputs[0].text == tokenizer.decode(output.outputs[0].token_ids)


def test_max_tokens_ends_with_finish_reason_length(llm: LLM) -> None:
    completion = run(llm, random_prompt(5, seed=1), greedy(max_tokens=3)).outputs[0]
    assert len(completion.token_ids) == 3 and completion.finish_reason == "length"


def test_a_stop_token_ends_generation_and_is_reported(llm: LLM) -> None:
    prompt = random_prompt(7, seed=2)
    free_run = run(llm, prompt, greedy(max_tokens=6)).outputs[0].token_ids
    stop_token = free_run[3]
    completion = run(llm, prompt, greedy(max_tokens=6, stop_token_ids=[stop_token])).outputs[0]
    assert completion.token_ids == free_run[: free_run.index(stop_token) + 1]
    assert (completion.finish_reason, completion.stop_reason) == ("stop", stop_token)


def test_min_tokens_suppresses_stop_tokens_until_reached(llm: LLM) -> None:
    prompt = random_prompt(7, seed=2)
    first = run(llm, prompt, greedy(max_tokens=1)).outputs[0].token_ids[0]
    completion = run(llm, prompt, greedy(max_tokens=4, stop_token_ids=[first], min_tokens=2)).outputs[0]
    assert completion.token_ids[0] != first and len(completion.token_ids) >= 2


def test_a_stop_string_cuts_the_text_before_it(llm: LLM) -> None:
    prompt = random_prompt(9, seed=3)
    free_text = run(llm, prompt, greedy(max_tokens=12)).outputs[0].text
    stop = free_text[3:6]
    completion = run(llm, prompt, greedy(max_tokens=12, stop=[stop])).outputs[0]
    assert completion.text == free_text[: free_text.index(stop)]
    assert (completion.finish_reason, completion.stop_reason) == ("stop", stop)


def test_stop_strings_are_ignored_before_min_tokens(llm: LLM) -> None:
    prompt = random_prompt(9, seed=3)
    free_run = run(llm, prompt, greedy(max_tokens=12)).outputs[0]
    completion = run(llm, prompt, greedy(max_tokens=12, min_tokens=12, stop=[free_run.text[:2]])).outputs[0]
    assert completion.text == free_run.text and completion.finish_reason == "length"


def test_greedy_logprobs_match_transformers(llm: LLM, hf_model) -> None:
    prompt = random_prompt(12, seed=4)
    output = run(llm, prompt, greedy(max_tokens=3, logprobs=2, prompt_logprobs=1))
    tokens = prompt + output.outputs[0].token_ids
    with torch.inference_mode():
        reference = torch.log_softmax(hf_model(torch.tensor([tokens])).logits[0], dim=-1)
    for step, entry in enumerate(output.outputs[0].logprobs):
        token = output.outputs[0].token_ids[step]
        row = reference[len(prompt) - 1 + step]
        assert entry[token].rank == 1
        assert entry[token].logprob == pytest.approx(float(row[token]), abs=1e-4)
        assert set(entry) == {token, int(row.topk(2).indices[1])}
    assert output.prompt_logprobs[0] is None
    for position, entry in enumerate(output.prompt_logprobs[1:], 1):
        assert entry[prompt[position]].logprob == pytest.approx(
            float(reference[position - 1, prompt[position]]), abs=1e-4
        )


def test_repetition_penalty_matches_transformers(llm: LLM, hf_model) -> None:
    prompt = random_prompt(10, seed=5)
    completion = run(llm, prompt, greedy(max_tokens=6, repetition_penalty=1.8)).outputs[0]
    expected = hf_model.generate(
        torch.tensor([prompt]),
        max_new_tokens=6,
        do_sample=False,
        repetition_penalty=1.8,
        eos_token_id=None,
        pad_token_id=0,
    )[0, len(prompt) :].tolist()
    assert completion.token_ids == expected


def test_presence_and_frequency_penalties_match_their_definition(llm: LLM, hf_model) -> None:
    prompt = random_prompt(10, seed=13)
    presence, frequency = 1.5, 0.7
    completion = run(llm, prompt, greedy(max_tokens=6, presence_penalty=presence, frequency_penalty=frequency))
    # OpenAI's definition on transformers' logits: subtract presence once per generated
    # token id and frequency per occurrence.
    expected: list[int] = []
    with torch.inference_mode():
        for _ in range(6):
            logits = hf_model(torch.tensor([prompt + expected])).logits[0, -1]
            counts = torch.bincount(torch.tensor(expected, dtype=torch.int64), minlength=logits.numel()).float()
            expected.append(int((logits - presence * (counts > 0) - frequency * counts).argmax()))
    assert completion.outputs[0].token_ids == expected


def test_n_samples_share_the_prompt_blocks(llm: LLM) -> None:
    prompt = random_prompt(100, seed=6)
    before = llm.llm_engine.stats.computed_prompt_tokens
    output = run(llm, prompt, SamplingParams(n=3, temperature=1.0, seed=3, max_tokens=5, ignore_eos=True))
    assert [c.index for c in output.outputs] == [0, 1, 2]
    assert len({tuple(c.token_ids) for c in output.outputs}) > 1
    # The first sample computes the prompt; the others reuse its 6 full blocks.
    assert llm.llm_engine.stats.computed_prompt_tokens - before == 100 + 2 * (100 - 96)


def test_one_sampling_params_per_prompt_applies_in_order(llm: LLM) -> None:
    prompts = [{"prompt_token_ids": random_prompt(4, seed=s)} for s in (7, 8)]
    outputs = llm.generate(prompts, [greedy(max_tokens=2), greedy(max_tokens=5)], use_tqdm=False)
    assert [len(o.outputs[0].token_ids) for o in outputs] == [2, 5]


def test_chat_applies_the_chat_template(llm: LLM) -> None:
    messages = [{"role": "user", "content": "Hello!"}]
    output = llm.chat(messages, greedy(max_tokens=2), use_tqdm=False)[0]
    assert output.prompt_token_ids == list(llm.get_tokenizer().apply_chat_template(messages, tokenize=True))


def test_abort_frees_every_block(llm: LLM) -> None:
    engine = llm.llm_engine
    engine.add_request("to-abort", {"prompt_token_ids": random_prompt(300, seed=9)}, greedy(max_tokens=50))
    engine.step()
    assert engine.scheduler.block_manager.num_used_blocks > 0
    engine.abort_request("to-abort")
    assert not engine.has_unfinished_requests()
    assert engine.scheduler.block_manager.num_used_blocks == 0


def test_seeded_sampling_is_the_same_alone_and_in_a_batch(llama_dir: Path, make_llm) -> None:
    llm = make_llm(llama_dir, backend="reference", max_model_len=256, num_gpu_blocks_override=64)
    seeded = SamplingParams(temperature=0.9, top_k=40, top_p=0.95, seed=1234, max_tokens=6, ignore_eos=True)
    prompt = {"prompt_token_ids": random_prompt(10, seed=20)}
    alone = llm.generate(prompt, seeded, use_tqdm=False)[0].outputs[0].token_ids
    mates = [{"prompt_token_ids": random_prompt(n, seed=n)} for n in (3, 30, 17)]
    mate_params = [SamplingParams(temperature=1.0, max_tokens=9, ignore_eos=True, seed=s) for s in (None, 5, None)]
    batch = llm.generate(mates[:2] + [prompt] + mates[2:], mate_params[:2] + [seeded] + mate_params[2:], use_tqdm=False)
    assert batch[2].outputs[0].token_ids == alone


def test_step_seeds_depend_only_on_seed_and_position() -> None:
    assert step_seed(5, 3) == step_seed(5, 3)
    assert len({step_seed(5, i) for i in range(100)} | {step_seed(6, i) for i in range(100)}) == 200


def test_an_fp8_kv_cache_is_stored_in_the_backends_fp8_format(llama_dir: Path, make_llm) -> None:
    llm = make_llm(llama_dir, backend="cpu", max_model_len=256, num_gpu_blocks_override=32, kv_cache_dtype="fp8")
    engine = llm.llm_engine
    worker = engine.executor.driver_worker
    assert {cache.dtype for layer in worker.runner.kv_caches for cache in layer} == {worker.backend.fp8_dtype()}
    completion = run(llm, random_prompt(20, seed=21), greedy(max_tokens=4)).outputs[0]
    assert len(completion.token_ids) == 4


def test_a_request_that_breaks_its_step_fails_alone_and_the_llm_stays_usable(
    llm: LLM, monkeypatch: pytest.MonkeyPatch
) -> None:
    healthy = [random_prompt(30, seed=31), random_prompt(45, seed=32), random_prompt(12, seed=33)]
    alone = [run(llm, prompt, greedy(max_tokens=5)).outputs[0].token_ids for prompt in healthy]
    poison_the_model(llm.llm_engine, monkeypatch)
    poisoned = random_prompt(20, seed=34) + [POISON_TOKEN]
    prompts = [healthy[0], poisoned, healthy[1], healthy[2]]
    outputs = llm.generate([{"prompt_token_ids": p} for p in prompts], greedy(max_tokens=5), use_tqdm=False)
    failed = outputs[1].outputs[0]
    assert failed.finish_reason == "error" and "injected kernel failure" in failed.stop_reason
    assert [outputs[i].outputs[0].token_ids for i in (0, 2, 3)] == alone
    assert [o.outputs[0].finish_reason for o in outputs] == ["length", "error", "length", "length"]
    assert run(llm, healthy[0], greedy(max_tokens=5)).outputs[0].token_ids == alone[0]
