"""Greedy outputs under production settings (chunked prefill, prefix caching, forced
preemption, 32 requests batched) equal each request run alone and transformers."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from engine_models import hf_greedy

from accord import SamplingParams

NUM_REQUESTS = 32
MAX_NEW_TOKENS = 8
SHARED_PREFIX = 48


def mixed_prompts(vocab_size: int) -> list[list[int]]:
    """32 prompts of 1..400 tokens; every third starts with a shared prefix so the prefix
    cache has something to find."""
    generator = torch.Generator().manual_seed(1)
    lengths = torch.randint(1, 401, (NUM_REQUESTS,), generator=generator).tolist()
    prefix = torch.randint(0, vocab_size, (SHARED_PREFIX,), generator=generator).tolist()
    prompts = []
    for index, length in enumerate(lengths):
        tokens = torch.randint(0, vocab_size, (length,), generator=generator).tolist()
        prompts.append((prefix + tokens)[:length] if index % 3 == 0 and length > SHARED_PREFIX else tokens)
    return prompts


@pytest.mark.slow
@pytest.mark.parametrize("architecture", ["llama", "deepseek_v3"])
def test_batched_greedy_equals_alone_and_transformers(
    architecture: str, request: pytest.FixtureRequest, make_llm
) -> None:
    model_dir: Path = request.getfixturevalue(f"{architecture}_dir")
    greedy = SamplingParams(temperature=0.0, max_tokens=MAX_NEW_TOKENS, ignore_eos=True)
    batched = make_llm(
        model_dir,
        backend="cpu",
        max_model_len=512,
        max_num_batched_tokens=64,
        max_num_seqs=NUM_REQUESTS,
        num_gpu_blocks_override=40,
        enable_prefix_caching=True,
    )
    vocab_size = batched.llm_engine.model_config.vocab_size
    prompts = mixed_prompts(vocab_size)
    outputs = batched.generate([{"prompt_token_ids": p} for p in prompts], greedy, use_tqdm=False)
    stats = batched.llm_engine.stats
    assert stats.num_preemptions > 0 and stats.prefix_cache_hits > 0

    alone = make_llm(
        model_dir, backend="cpu", max_model_len=512, num_gpu_blocks_override=64, enable_prefix_caching=False
    )
    alone_tokens = [
        alone.generate({"prompt_token_ids": p}, greedy, use_tqdm=False)[0].outputs[0].token_ids for p in prompts
    ]
    batched_tokens = [output.outputs[0].token_ids for output in outputs]
    assert batched_tokens == alone_tokens
    assert batched_tokens == hf_greedy(model_dir, prompts, MAX_NEW_TOKENS)
