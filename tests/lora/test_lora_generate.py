"""Multi-LoRA through `accord.LLM`: one batch of requests for the base model and two
adapters (one targeting every projection, one some of them with rsLoRA scaling) gives
each request the greedy tokens of transformers with that adapter merged by PEFT, on a
tiny random Llama and Qwen3; with fewer device slots than adapters the scheduler runs
them in turns and the slots swap, with the same tokens."""

from __future__ import annotations

from pathlib import Path

import pytest
from lora_helpers import merged_greedy

from accord import LLM, LoRARequest, SamplingParams

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


def generate(model_dir: Path, prompts, loras, **engine_args) -> list[list[int]]:
    engine_args.setdefault("max_num_batched_tokens", 64)  # a given budget: no step timing at start
    llm = LLM(str(model_dir), backend="cpu", enable_lora=True, max_lora_rank=16, max_num_seqs=16,
              max_model_len=128, kv_cache_memory=1 << 22, block_size=4, **engine_args)
    try:
        outputs = llm.generate([{"prompt_token_ids": p} for p in prompts],
                               SamplingParams(temperature=0.0, max_tokens=MAX_TOKENS, ignore_eos=True),
                               use_tqdm=False, lora_request=loras)
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
