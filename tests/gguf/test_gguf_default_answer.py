"""The default model (SmolLM2-135M-Instruct, Q4_1) gives the README's first answer on
every CPU: `--dtype auto` computes it in fp32 on both cpu bf16 paths, and answers "The
capital of France is Paris."; asked for bf16 on a CPU with native bf16, its logits are
fp32, so the first token's two candidates ("The" and "L", a knife edge for this model)
are no longer tied by a bf16 rounding."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from accord import LLM, SamplingParams

pytestmark = pytest.mark.slow

QUESTION = [{"role": "user", "content": "What is the capital of France?"}]
README_ANSWER = "The capital of France is Paris."


def small_llm(path: Path, dtype: str) -> LLM:
    return LLM(str(path), dtype=dtype, max_model_len=256, max_num_seqs=2, max_num_batched_tokens=256,
               kv_cache_memory=16 << 20)


def answer(llm: LLM, logprobs: int | None = None):
    params = SamplingParams(temperature=0.0, max_tokens=32, logprobs=logprobs)
    return llm.chat(QUESTION, params, use_tqdm=False)[0].outputs[0]


@pytest.mark.slow
@pytest.mark.parametrize("forced_path", ["forced_native_bf16", "forced_fp32_bf16"])
def test_auto_computes_the_default_model_in_fp32_and_answers_paris(
    smollm2_gguf: Path, forced_path: str, request: pytest.FixtureRequest
) -> None:
    request.getfixturevalue(forced_path)
    llm = small_llm(smollm2_gguf, "auto")
    assert llm.llm_engine.executor.driver_worker.model_config.dtype == torch.float32
    assert answer(llm).text == README_ANSWER


@pytest.mark.slow
def test_bf16_logits_of_the_first_token_are_not_tied(smollm2_gguf: Path, forced_native_bf16) -> None:
    llm = small_llm(smollm2_gguf, "bfloat16")
    assert llm.llm_engine.executor.driver_worker.model_config.dtype == torch.bfloat16
    first = answer(llm, logprobs=2).logprobs[0]
    top = sorted((entry.logprob for entry in first.values()), reverse=True)[:2]
    # Rounded to bf16 before sampling, "L" and "The" scored exactly alike (-1.96366...).
    assert top[0] != top[1]
