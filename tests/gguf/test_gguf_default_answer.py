"""The default model (SmolLM2-135M-Instruct, Q4_1) gives the README's first answer on
every CPU: `--dtype auto` computes it in fp32 with its weights packed, on both cpu bf16
paths, and answers "The capital of Germany is Berlin.". Dequantised at load
(ACCORD_GGUF_PACKED=0), in fp32, it answers the knife-edge question the README names
("What is the capital of France?": "The" leads "L" by 0.08) as transformers does on the
same file; asked for bf16 on a CPU with native bf16, its logits are fp32, so that
question's two candidates are no longer tied by a bf16 rounding."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from accord import LLM, SamplingParams
from accord.core.model_loader.gguf.source import PACKED_ENV
from accord.core.worker.contract_ops import worker_contract_ops

pytestmark = pytest.mark.slow

README_QUESTION = [{"role": "user", "content": "What is the capital of Germany?"}]
README_ANSWER = "The capital of Germany is Berlin."
KNIFE_EDGE_QUESTION = [{"role": "user", "content": "What is the capital of France?"}]
KNIFE_EDGE_ANSWER = "The capital of France is Paris."


def small_llm(path: Path, dtype: str) -> LLM:
    return LLM(str(path), dtype=dtype, max_model_len=256, max_num_seqs=2, max_num_batched_tokens=256,
               kv_cache_memory=16 << 20)


def answer(llm: LLM, question: list[dict], logprobs: int | None = None):
    params = SamplingParams(temperature=0.0, max_tokens=32, logprobs=logprobs)
    return llm.chat(question, params, use_tqdm=False)[0].outputs[0]


@pytest.fixture
def dequantised(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(PACKED_ENV, "0")


@pytest.mark.parametrize("forced_path", ["forced_native_bf16", "forced_fp32_bf16"])
def test_auto_computes_the_default_model_packed_in_fp32_and_answers_berlin(
    smollm2_gguf: Path, forced_path: str, request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch
) -> None:
    request.getfixturevalue(forced_path)
    monkeypatch.delenv(PACKED_ENV, raising=False)  # the default
    llm = small_llm(smollm2_gguf, "auto")
    assert llm.llm_engine.executor.driver_worker.model_config.dtype == torch.float32
    assert "quant_linear" in worker_contract_ops(smollm2_gguf)
    assert answer(llm, README_QUESTION).text == README_ANSWER


@pytest.mark.parametrize("forced_path", ["forced_native_bf16", "forced_fp32_bf16"])
def test_dequantised_in_fp32_it_answers_the_knife_edge_question_with_paris(
    smollm2_gguf: Path, forced_path: str, request: pytest.FixtureRequest, dequantised
) -> None:
    request.getfixturevalue(forced_path)
    llm = small_llm(smollm2_gguf, "auto")
    assert llm.llm_engine.executor.driver_worker.model_config.dtype == torch.float32
    assert answer(llm, KNIFE_EDGE_QUESTION).text == KNIFE_EDGE_ANSWER


def test_bf16_logits_of_the_first_token_are_not_tied(smollm2_gguf: Path, forced_native_bf16, dequantised) -> None:
    llm = small_llm(smollm2_gguf, "bfloat16")
    assert llm.llm_engine.executor.driver_worker.model_config.dtype == torch.bfloat16
    first = answer(llm, KNIFE_EDGE_QUESTION, logprobs=2).logprobs[0]
    top = sorted((entry.logprob for entry in first.values()), reverse=True)[:2]
    # Rounded to bf16 before sampling, "L" and "The" scored exactly alike (-1.96366...).
    assert top[0] != top[1]
