"""Every supported architecture against transformers on tiny random checkpoints, through
the reference and the cpu backends: full-prompt logits and the greedy continuation."""

from __future__ import annotations

from pathlib import Path
from typing import Callable

import pytest
import torch

from accord.backends import get_backend
from accord.core.model_loader.load import load_model
from accord.op_contracts import OpDispatcher
from tiny_models import ARCHITECTURES, NEW_TOKENS, PROMPT_LEN, fixed_prompt
from single_sequence import SingleSequenceRunner

BACKENDS = ("reference", "cpu")
#: fp32: max |diff| over the prompt's logits, relative to the logits' max magnitude.
FP32_BOUND = 1e-3
#: bf16: both sides round every op's output to bf16 (8 bits of mantissa), in different
#: places (fused residual adds, rope and norms computed in fp32 and rounded once here),
#: so two layers of independent rounding leave a few percent of the logits' scale.
BF16_BOUND = 5e-2

AccordRun = Callable[[str, str, torch.dtype], tuple[torch.Tensor, list[int]]]


@pytest.fixture(scope="module")
def accord_run(checkpoint: Callable[[str], Path]) -> AccordRun:
    """`accord_run(name, backend, dtype)`: accord's (prompt logits, greedy continuation)
    for the test prompt, once per module (fp32 runs decode; bf16 runs only prefill)."""
    cache: dict[tuple[str, str, torch.dtype], tuple[torch.Tensor, list[int]]] = {}

    def get(name: str, backend: str, dtype: torch.dtype) -> tuple[torch.Tensor, list[int]]:
        if (name, backend, dtype) not in cache:
            ops = OpDispatcher(get_backend(backend), strict=True)
            runner = SingleSequenceRunner(load_model(checkpoint(name), ops, dtype=dtype).model, PROMPT_LEN + NEW_TOKENS)
            new_tokens = NEW_TOKENS if dtype == torch.float32 else 1
            cache[name, backend, dtype] = runner.generate(fixed_prompt(), new_tokens)
        return cache[name, backend, dtype]

    return get


def relative_max_diff(logits: torch.Tensor, reference: torch.Tensor) -> float:
    """max |logits - reference| / max |reference|."""
    return float((logits - reference).abs().max() / reference.abs().max())


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("name", ARCHITECTURES)
def test_fp32_prompt_logits_match_transformers(name, backend, accord_run, transformers_logits):
    logits, _ = accord_run(name, backend, torch.float32)
    assert relative_max_diff(logits, transformers_logits(name, torch.float32)) < FP32_BOUND


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("name", ARCHITECTURES)
def test_fp32_greedy_continuation_matches_transformers(name, backend, accord_run, transformers_greedy):
    _, continuation = accord_run(name, backend, torch.float32)
    assert continuation == transformers_greedy(name)


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("name", ARCHITECTURES)
def test_bf16_prompt_logits_match_transformers_within_bf16_bound(name, backend, accord_run, transformers_logits):
    logits, _ = accord_run(name, backend, torch.bfloat16)
    assert relative_max_diff(logits, transformers_logits(name, torch.bfloat16)) < BF16_BOUND
