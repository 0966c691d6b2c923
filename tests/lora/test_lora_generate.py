"""Multi-LoRA through `accord.LLM`: one batch of requests for the base model and two
adapters (one targeting every projection, one some of them with rsLoRA scaling) gives
each request the greedy tokens of transformers with that adapter merged by PEFT, on a
tiny random Llama and Qwen3; with fewer device slots than adapters the scheduler runs
them in turns and the slots swap, with the same tokens, as they are when requests are
preempted for blocks and recomputed; under a regex, each adapter's
text is the PEFT-merged model's under the same regex."""

from __future__ import annotations

import re
import shutil
from pathlib import Path

import pytest
import torch
from lora_helpers import merged_greedy

from accord import LLM, LoRARequest, SamplingParams
from accord.core.structured_output.params import StructuredOutputsParams

PROMPTS = [[1, 17, 33, 90, 5, 61, 7], [1, 4, 8, 15, 16, 23, 42, 9, 11], [1, 70, 71, 72]]
MAX_TOKENS = 8


def mixed_batch(adapters: dict[str, Path]) -> tuple[list[list[int]], list[LoRARequest | None], list[Path | None]]:
    """Every prompt under the base, adapter a and adapter b, interleaved in one batch."""
    requests = {"a": LoRARequest("a", 1, str(adapters["a"])), "b": LoRARequest("b", 2, str(adapters["b"]))}
    prompts, loras, dirs = [], [], []
    for prompt in PROMPTS:
        for name in (None, "a", "b"):
            prompts.append(prompt)
            loras.append(requests[name] if name else None)
            dirs.append(adapters[name] if name else None)
    return prompts, loras, dirs


def expected(model_dir: Path, dirs: list[Path | None]) -> list[list[int]]:
    by_adapter = {d: merged_greedy(model_dir, d, PROMPTS, MAX_TOKENS) for d in dict.fromkeys(dirs)}
    return [by_adapter[d][i // 3] for i, d in enumerate(dirs)]


def generate(model_dir: Path, prompts, loras, min_preemptions: int = 0, **engine_args) -> list[list[int]]:
    """Each prompt's greedy tokens under its adapter, through `LLM`; the run must have
    preempted at least `min_preemptions` times."""
    engine_args.setdefault("max_num_batched_tokens", 64)  # a given budget: no step timing at start
    engine_args.setdefault("max_model_len", 128)
    llm = LLM(str(model_dir), backend="cpu", enable_lora=True, max_lora_rank=16, max_num_seqs=16,
              kv_cache_memory=1 << 22, block_size=4, **engine_args)
    try:
        outputs = llm.generate([{"prompt_token_ids": p} for p in prompts],
                               SamplingParams(temperature=0.0, max_tokens=MAX_TOKENS, ignore_eos=True),
                               use_tqdm=False, lora_request=loras)
        assert llm.llm_engine.stats.num_preemptions >= min_preemptions
        return [list(o.outputs[0].token_ids) for o in outputs]
    finally:
        llm.llm_engine.shutdown()


@pytest.mark.slow
@pytest.mark.parametrize("model", ["llama", "qwen3"])
def test_a_mixed_batch_matches_each_adapter_merged_by_peft(model: str, request: pytest.FixtureRequest) -> None:
    model_dir = request.getfixturevalue(f"{model}_dir")
    prompts, loras, dirs = mixed_batch(request.getfixturevalue(f"{model}_adapters"))
    want = expected(model_dir, dirs)
    # The adapters change the tokens, so matching them is not matching the base.
    assert want[1] != want[0] and want[2] != want[0] and want[1] != want[2]
    assert generate(model_dir, prompts, loras, max_loras=2) == want


@pytest.mark.slow
def test_one_device_slot_serves_two_adapters_in_turns(llama_dir: Path, llama_adapters: dict[str, Path]) -> None:
    prompts, loras, dirs = mixed_batch(llama_adapters)
    assert generate(llama_dir, prompts, loras, max_loras=1, max_cpu_loras=1) == expected(llama_dir, dirs)


@pytest.mark.slow
def test_chunked_prefill_and_speculative_decoding_keep_each_adapter_s_tokens(
    llama_dir: Path, llama_adapters: dict[str, Path]
) -> None:
    prompts, loras, dirs = mixed_batch(llama_adapters)
    # 8-token steps chunk every prompt; ngram drafts are checked under each token's adapter.
    spec = {"method": "ngram", "num_speculative_tokens": 3, "prompt_lookup_min": 1, "prompt_lookup_max": 3}
    got = generate(llama_dir, prompts, loras, max_loras=2, max_num_batched_tokens=8, speculative_config=spec)
    assert got == expected(llama_dir, dirs)


@pytest.mark.slow
def test_requests_preempted_for_blocks_resume_under_their_own_adapter(
    llama_dir: Path, llama_adapters: dict[str, Path]
) -> None:
    prompts, loras, dirs = mixed_batch(llama_adapters)
    # 12 blocks of 4 tokens (a context of 48) for nine requests of up to 17 tokens: some
    # are preempted and recomputed.
    got = generate(llama_dir, prompts, loras, min_preemptions=1, max_loras=2, num_gpu_blocks_override=12,
                   max_model_len=48)
    assert got == expected(llama_dir, dirs)


@pytest.mark.slow
def test_structured_output_under_an_adapter_is_that_of_the_peft_merged_model(
    llama_dir: Path, llama_adapters: dict[str, Path], tmp_path: Path
) -> None:
    # The reference: each adapter merged into the base by PEFT, saved, and served without
    # LoRA under the same regex; the grammar masks the adapter's logits, not the base's.
    from peft import PeftModel
    from transformers import AutoModelForCausalLM

    constrained = SamplingParams(temperature=0.0, max_tokens=24,
                                 structured_outputs=StructuredOutputsParams(regex=r"[a-z]{3,8}( [a-z]{3,8}){2}"))
    prompts = [{"prompt_token_ids": p} for p in PROMPTS]

    def texts(model_dir: Path, lora: LoRARequest | None) -> list[str]:
        llm = LLM(str(model_dir), backend="cpu", enable_lora=lora is not None, max_lora_rank=16, max_num_seqs=8,
                  max_model_len=128, kv_cache_memory=1 << 22, block_size=4, max_num_batched_tokens=64)
        try:
            outputs = llm.generate(prompts, constrained, use_tqdm=False, lora_request=lora)
            return [o.outputs[0].text for o in outputs]
        finally:
            llm.llm_engine.shutdown()

    found = {}
    for number, name in enumerate("ab", start=1):
        merged = tmp_path / f"merged-{name}"
        base = AutoModelForCausalLM.from_pretrained(llama_dir, dtype=torch.float32)
        PeftModel.from_pretrained(base, llama_adapters[name]).merge_and_unload().save_pretrained(merged)
        for tokenizer_file in ("tokenizer.json", "tokenizer_config.json"):
            shutil.copy(llama_dir / tokenizer_file, merged / tokenizer_file)
        found[name] = texts(llama_dir, LoRARequest(name, number, str(llama_adapters[name])))
        assert found[name] == texts(merged, None)
        assert all(re.fullmatch(r"[a-z]{3,8}( [a-z]{3,8}){2}", text) for text in found[name])
    assert found["a"] != found["b"]  # the adapters steer the constrained choice apart
